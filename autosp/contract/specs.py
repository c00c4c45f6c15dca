"""The value types the cost model, the planner and the compiler share.

Everything here is a frozen dataclass of plain numbers and strings: cheap to build, hashable, and
serialisable to JSON with ``dataclasses.asdict``. No torch, no numpy: the planner imports this on its
start-up path.

Units: bytes, seconds, FLOP and FLOP/s throughout; bandwidths are bytes/s *per GPU, one direction*.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
from dataclasses import asdict, dataclass, field, fields

from autosp.contract.knobs import BY_NAME, CHECKPOINTING_POLICIES, OVERLAP_SCHEDULES
from autosp.contract.rules import CANDIDATE, broken, rules_of

DTYPES = ("bf16", "fp32")
OPTIMIZERS = ("adamw",)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def fingerprint_of(obj) -> str:
    """A short stable hash of a dataclass's fields (sorted-key JSON)."""
    payload = json.dumps(asdict(obj), sort_keys=True, default=str).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _fingerprint_of_frozen(spec) -> str:
    """The fingerprint of a frozen (hashable, equal-when-its-fields-are) spec, kept: every plan request hashes its
    model and cluster for the plan cache's key, ~0.5 ms each (asdict, JSON, SHA-256), a sweep of 1,000 requests
    the same few specs."""
    return spec._fingerprint()


def from_dict(cls, data: dict):
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys with a clear message."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return cls(**data)


_LATER_FIELDS = {"sliding_window": 0, "sliding_layers": (), "n_experts": 0, "experts_per_token": 0,
                 "expert_ffn_hidden": 0, "shared_ffn_hidden": 0, "dense_layers": (), "attn_logit_softcap": 0.0,
                 "final_logit_softcap": 0.0, "attn_output_gate": False, "linear_layers": (), "linear_num_key_heads": 0,
                 "linear_num_value_heads": 0, "linear_key_head_dim": 0, "linear_value_head_dim": 0,
                 "linear_conv_kernel_dim": 0, "expert_bias": False, "clamped_swiglu": False, "attention_sinks": False}

LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel_dim")
"""The Gated DeltaNet widths of a hybrid model's linear-attention layers (Hugging Face's config keys)."""


def _mlp_matrices(model) -> int:
    return 3 if model.gated_mlp else 2


def check_spec(model) -> None:
    """ValueError unless the ModelSpec's mixture-of-experts fields describe a model (or are all unset)."""
    E, k, fe, fs = model.n_experts, model.experts_per_token, model.expert_ffn_hidden, model.shared_ffn_hidden
    for name in ("n_experts", "experts_per_token", "expert_ffn_hidden", "shared_ffn_hidden"):
        value = getattr(model, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ModelSpec.{name} must be a non-negative integer, got {value!r}")
    for name in ("expert_bias", "clamped_swiglu", "attention_sinks"):
        if not isinstance(getattr(model, name), bool):
            raise ValueError(f"ModelSpec.{name} must be true or false, got {getattr(model, name)!r}")
    if not E:
        if model.expert_bias or model.clamped_swiglu:
            raise ValueError("ModelSpec.expert_bias and clamped_swiglu describe experts: they need n_experts > 0")
        if k or fe or fs or model.dense_layers:
            raise ValueError("ModelSpec.experts_per_token, expert_ffn_hidden, shared_ffn_hidden and dense_layers "
                             "describe experts: they need n_experts > 0")
    else:
        if not 1 <= k <= E:
            raise ValueError(f"ModelSpec.experts_per_token must be in [1, n_experts={E}], got {k!r}")
        if fe < 1:
            raise ValueError("ModelSpec.expert_ffn_hidden must be positive for a mixture-of-experts model")
        layers = model.dense_layers
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < model.n_layers for i in layers) \
                or list(layers) != sorted(set(layers)) or len(layers) >= model.n_layers:
            raise ValueError(f"ModelSpec.dense_layers must be increasing layer indices in [0, {model.n_layers}) "
                             f"leaving at least one MoE layer, got {list(layers)!r}")
    for name in ("attn_logit_softcap", "final_logit_softcap"):
        value = getattr(model, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"ModelSpec.{name} must be a non-negative number, got {value!r}")
    check_linear(model)


def check_linear(model) -> None:
    """ValueError unless the linear-attention fields describe Gated DeltaNet layers (or are all unset)."""
    layers = model.linear_layers
    widths = [getattr(model, name) for name in LINEAR_FIELDS]
    for name, value in zip(LINEAR_FIELDS, widths):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ModelSpec.{name} must be a non-negative integer, got {value!r}")
    if not layers:
        if any(widths):
            raise ValueError(f"ModelSpec.{', '.join(LINEAR_FIELDS)} describe linear-attention layers: they need "
                             "linear_layers")
        return
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < model.n_layers for i in layers) \
            or list(layers) != sorted(set(layers)):
        raise ValueError(f"ModelSpec.linear_layers must be increasing layer indices in [0, {model.n_layers}), "
                         f"got {list(layers)!r}")
    if not all(widths):
        raise ValueError(f"ModelSpec.linear_layers needs every one of {', '.join(LINEAR_FIELDS)} positive")
    if model.linear_num_value_heads % model.linear_num_key_heads:
        raise ValueError(f"linear_num_value_heads ({model.linear_num_value_heads}) must be a multiple of "
                         f"linear_num_key_heads ({model.linear_num_key_heads})")
    if set(layers) & set(model.sliding_layers):
        raise ValueError("a layer is either a linear-attention layer or a sliding-window one, not both")


def moe_mlp_params(model, active: bool = False) -> int:
    """Parameters of one MoE layer's MLP: router + shared experts + every routed expert (``active``: the k a
    token uses)."""
    h, m = model.hidden, _mlp_matrices(model)
    routed = model.experts_per_token if active else model.n_experts
    router = (h + 1 if model.expert_bias else h) * model.n_experts
    return router + m * h * model.shared_ffn_hidden + routed * expert_params_each(model)


def expert_params_each(model) -> int:
    """Parameters of one routed expert: its m matrices h x f_e and, with ``expert_bias`` (gpt-oss), the biases of
    its gate/up projection ((m - 1) f_e) and its down projection (h)."""
    h, m, fe = model.hidden, _mlp_matrices(model), model.expert_ffn_hidden
    return m * h * fe + (((m - 1) * fe + h) if model.expert_bias else 0)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as cost goes.

    ``ffn_hidden`` is the intermediate width of the MLP; with ``gated_mlp`` (SwiGLU) there are three
    matrices hidden x ffn_hidden, otherwise two.

    Sliding-window attention: the layers listed in ``sliding_layers`` (0-based indices) attend to the
    ``sliding_window`` most recent tokens only (each query sees keys q - W + 1 .. q, Hugging Face's
    ``sliding_window``); the others attend to the whole causal prefix. ``sliding_window = 0`` (and no
    layers): every layer is global.

    Mixture of experts (``n_experts`` > 0; cost_models/moe.py): the MLP of every layer not in ``dense_layers``
    is ``n_experts`` routed experts of width ``expert_ffn_hidden`` (gated like ``gated_mlp``), of which each
    token uses ``experts_per_token`` (top-k), a router (hidden x n_experts) and, with ``shared_ffn_hidden`` > 0,
    shared experts every token uses (their total width). ``dense_layers`` keep a dense MLP of ``ffn_hidden``.

    Logit soft-capping (Gemma 2): ``attn_logit_softcap`` caps attention scores, ``final_logit_softcap`` the
    LM head's logits (cap x tanh(x / cap)); 0 = none.

    Hybrid linear attention (Qwen3-Next, Qwen3.5; cost_models/linear_attention.py): the layers in ``linear_layers``
    mix the sequence with a Gated DeltaNet instead of softmax attention: q and k of ``linear_num_key_heads`` x
    ``linear_key_head_dim``, v and the output gate z of ``linear_num_value_heads`` x ``linear_value_head_dim``, a
    depthwise causal conv1d of ``linear_conv_kernel_dim`` taps over q/k/v and a recurrent state of d_k x d_v per
    value head. ``attn_output_gate``: the softmax-attention layers' q projection also yields a per-channel sigmoid
    gate on the attention output (Qwen3-Next and Qwen3.5's gated attention: q_proj is hidden x 2 q_dim).

    gpt-oss: ``expert_bias``, the routed experts' projections and the router carry biases; ``clamped_swiglu``, the
    experts' gate is gpt-oss's clamped SwiGLU (more intermediates than SiLU's, cost_models/moe.py);
    ``attention_sinks``, one learned logit per head in every softmax-attention layer's softmax.
    """

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    qkv_bias: bool = False
    norm: str = "rmsnorm"
    max_position: int = 0
    rope_theta: float = 10000.0
    source: str = ""
    sliding_window: int = 0
    sliding_layers: tuple = ()
    # mixture of experts (cost_models/moe.py): 0 experts = dense
    n_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden: int = 0
    shared_ffn_hidden: int = 0
    dense_layers: tuple = ()
    # Gemma 2 logit soft-capping (0 = none): cap * tanh(x / cap) on attention scores / final logits
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    # hybrid linear attention (cost_models/linear_attention.py): Gated DeltaNet layers and their widths
    attn_output_gate: bool = False
    linear_layers: tuple = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # gpt-oss: biased experts and router, the clamped SwiGLU, attention sinks (one parameter per head)
    expert_bias: bool = False
    clamped_swiglu: bool = False
    attention_sinks: bool = False

    def __post_init__(self):
        object.__setattr__(self, "sliding_layers", tuple(self.sliding_layers))  # JSON gives a list
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        object.__setattr__(self, "linear_layers", tuple(self.linear_layers))
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        window, layers = self.sliding_window, self.sliding_layers
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"ModelSpec.sliding_window must be a non-negative integer, got {window!r}")
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers for i in layers) \
                or list(layers) != sorted(set(layers)):
            raise ValueError(f"ModelSpec.sliding_layers must be increasing layer indices in [0, {self.n_layers}), "
                             f"got {list(layers)!r}")
        if bool(window) != bool(layers):
            raise ValueError("ModelSpec.sliding_window and sliding_layers go together: a window needs the layers "
                             "it applies to, and windowed layers need a window")
        check_spec(self)

    @property
    def windowed_layers(self) -> int:
        """How many layers use the sliding window."""
        return len(self.sliding_layers)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def moe_layers(self) -> int:
        """How many layers have a mixture-of-experts MLP (0 for a dense model)."""
        return self.n_layers - len(self.dense_layers) if self.n_experts else 0

    @property
    def attention_layers(self) -> int:
        """How many layers run softmax attention (all but the linear-attention ones)."""
        return self.n_layers - len(self.linear_layers)

    def attention_params(self) -> int:
        """Attention projections (and their biases) of one softmax-attention layer plus its two norms; with
        ``attn_output_gate`` the q projection's gate half and the q/k norms (Qwen3-Next / Qwen3.5)."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.attn_output_gate:
            attn += h * self.q_dim + 2 * self.head_dim
        if self.attention_sinks:
            attn += self.n_heads
        return attn + 2 * h

    def linear_attention_params(self) -> int:
        """Parameters of one Gated DeltaNet layer's mixer plus the layer's two norms (transformers' Qwen3-Next and
        Qwen3.5 layers): the q/k/v/z and b/a input projections, the conv1d (no bias), A_log and dt_bias per value
        head, the gated RMSNorm's weight and the output projection; 0 for a model without such layers."""
        if not self.linear_layers:
            return 0
        h, nv = self.hidden, self.linear_num_value_heads
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = nv * self.linear_value_head_dim
        conv = (2 * key + value) * self.linear_conv_kernel_dim
        return h * (2 * key + 2 * value + 2 * nv) + value * h + conv + 2 * nv + self.linear_value_head_dim + 2 * h

    def mlp_params(self, active: bool = False) -> int:
        """The MLP of one layer: a mixture of experts' (every expert, the router and the shared experts; ``active``:
        the routed experts one token uses) when the model has any, else the dense one."""
        return moe_mlp_params(self, active) if self.n_experts else _mlp_matrices(self) * self.hidden * self.ffn_hidden

    def layer_params(self, active: bool = False) -> int:
        """Parameters of one decoder layer (attention, MLP and its two norms); of a mixture-of-experts layer
        (every expert, the router and the shared experts; ``active``: the routed experts one token uses) when
        the model has any; of a hybrid model the larger of its softmax- and linear-attention layers (what ZeRO-3
        gathers at once)."""
        return max(self.attention_params(), self.linear_attention_params()) + self.mlp_params(active)

    def embedding_params(self) -> int:
        """Input embedding plus output head (counted once when tied) plus the final norm."""
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied_embeddings else 2) + self.hidden

    def n_params(self, active: bool = False) -> int:
        """All the model's parameters; ``active``: those one token uses (a mixture of experts' routed experts
        it skips left out; the same count for a dense model)."""
        mixers = (self.attention_layers * self.attention_params()
                  + len(self.linear_layers) * self.linear_attention_params())
        if not self.n_experts:
            return mixers + self.n_layers * self.mlp_params() + self.embedding_params()
        dense = _mlp_matrices(self) * self.hidden * self.ffn_hidden
        return (mixers + self.moe_layers * self.mlp_params(active) + (self.n_layers - self.moe_layers) * dense
                + self.embedding_params())

    def fingerprint(self) -> str:
        """Fields added after the first plans were written (windows, experts, soft-capping) are left out while
        they hold their defaults, so models described before them keep their fingerprints (committed plans,
        caches)."""
        return _fingerprint_of_frozen(self)

    def _fingerprint(self) -> str:
        data = {k: v for k, v in asdict(self).items() if not (k in _LATER_FIELDS and v == _LATER_FIELDS[k])}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AcceleratorSpec:
    """One device. ``peak_flops`` is dense bf16 (fp32 for CPU profiles) without sparsity."""

    name: str
    peak_flops: float
    memory_bytes: float
    memory_bandwidth: float
    source: str = ""


@dataclass(frozen=True)
class HardwareSpec:
    """A cluster of ``nodes`` x ``devices_per_node`` identical accelerators.

    The efficiency factors turn datasheet peaks into what training kernels reach; catalog entries use
    published defaults and ``autosp-calibrate`` replaces them with measurements.
    """

    name: str
    accelerator: AcceleratorSpec
    devices_per_node: int
    nodes: int = 1
    intra_node_bandwidth: float = 0.0
    intra_node_latency: float = 0.0
    inter_node_bandwidth: float = 0.0
    inter_node_latency: float = 0.0
    host_bandwidth: float = 0.0
    host_memory_bytes: float = 0.0
    host_memory_bandwidth: float = 0.0
    """Sustained host DRAM bandwidth of one node (B/s): what CPU Adam streams through under optimizer offload and
    what offloaded chunks' copies share. 0: not known (the cost model then assumes a DGX H100 node's)."""
    matmul_efficiency: float = 0.6
    attention_efficiency: float = 0.5
    comm_efficiency: float = 0.8
    usable_memory_fraction: float = 0.95
    source: str = ""
    attention_kernel: str = ""
    """The attention kernel ``attention_efficiency`` prices (flash2, flash3, cudnn, flex:
    cost_models/catalog/attention_kernels.py); empty where the figure is not per kernel."""

    def __post_init__(self):
        if self.devices_per_node < 1 or self.nodes < 1:
            raise ValueError("devices_per_node and nodes must be >= 1")

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.nodes

    def fingerprint(self) -> str:
        return _fingerprint_of_frozen(self)

    def _fingerprint(self) -> str:
        return fingerprint_of(self)


@dataclass(frozen=True)
class Workload:
    """What to train: ``seq_len`` tokens per sequence.

    ``global_batch`` is sequences per optimizer step; ``None`` lets each candidate use one micro-batch
    per data-parallel replica (the usual long-context setting).

    ``doc_lens``: packed documents, a histogram ``((length, count), ...)`` of document lengths in tokens
    (increasing lengths): documents are laid end to end and cut into sequences of ``seq_len`` tokens, and
    attention stays inside each document (cost_models/documents.py). Empty: every sequence is one document
    (unpacked).

    ``compile_backend``: how the training step runs. ``inductor`` (autosp-train's default) fuses an untiled
    cross-entropy, which then holds the logits and one fp32 tensor per logit at its peak; ``aot_eager`` and
    ``eager`` (no torch.compile: ALST, the Hugging Face Trainer without autosp) run it op by op, with fp32
    log-softmax, its gradient and the upcast logits' gradient alive at once (cost_models/memory.py). Nothing
    else the cost model prices depends on it.
    """

    seq_len: int
    global_batch: int | None = None
    dtype: str = "bf16"
    optimizer: str = "adamw"
    doc_lens: tuple = ()
    compile_backend: str = "inductor"

    def __post_init__(self):
        pairs = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in self.doc_lens)
        object.__setattr__(self, "doc_lens", pairs)  # JSON gives lists of lists
        if any(not isinstance(p, tuple) or len(p) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                                              for v in p) for p in pairs) \
                or [p[0] for p in pairs] != sorted({p[0] for p in pairs}):
            raise ValueError("doc_lens must be (length, count) pairs of positive integers with increasing lengths, "
                             f"got {list(self.doc_lens)[:4]!r}")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer, got {self.seq_len!r}")
        if self.global_batch is not None and self.global_batch < 1:
            raise ValueError(f"global_batch must be positive, got {self.global_batch!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile_backend must be one of {COMPILE_BACKENDS}, got {self.compile_backend!r}")


def hardware_from_dict(data: dict) -> HardwareSpec:
    """A HardwareSpec from its ``dataclasses.asdict`` form (a hardware file, a plan's ``hardware``)."""
    data = dict(data)
    data["accelerator"] = from_dict(AcceleratorSpec, data["accelerator"])
    return from_dict(HardwareSpec, data)


def workload_key(workload: Workload) -> dict:
    """The workload as a plain dict for cache keys: ``doc_lens`` only when documents are packed and
    ``compile_backend`` only when it is not Inductor, so the other requests keep the keys they had before."""
    data = asdict(workload)
    if workload.compile_backend == "inductor":
        del data["compile_backend"]
    if not workload.doc_lens:
        del data["doc_lens"]
    else:
        data["doc_lens"] = [list(p) for p in workload.doc_lens]
    return data


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: every knob the compiler applies.

    ``sp`` x ``dp`` is the world size. Field names are the plan's and the compiler's (one to one).
    ``offload_optimizer`` is DeepSpeed's ZeRO-Offload: fp32 master weights, Adam states and the
    optimizer step live on the host (CPU Adam); the device keeps the bf16 weights and gradient buckets.

    2-D sequence parallelism: the SP group of ``sp`` ranks is ``ulysses`` x ``ring``: Ulysses
    all-to-alls over ``sp // ring`` ranks (heads), ring attention over ``ring`` ranks (key/value blocks
    passed rank to rank). ``ring=1`` is pure Ulysses, ``ring=sp`` pure ring attention.

    ``sequence_chunks``: each decoder layer runs over the rank's tokens in that many chunks (attention of
    chunk i over key/value chunks <= i, merged by log-sum-exp); ``offload_chunks`` keeps the chunks'
    saved tensors in host memory. ``offload_param``: ZeRO-3 parameter offload (weights live on the host
    and are fetched layer by layer).

    ``ep``: expert parallelism of a mixture-of-experts model: each group of ``ep`` consecutive ranks (SP and DP
    ranks alike, which all hold distinct tokens) splits every MoE layer's experts ``n_experts / ep`` per rank and
    sends each token to its experts' ranks and back by all-to-all; ZeRO then shards the expert states over the
    ``sp x dp / ep`` ranks holding the same experts (cost_models/moe.py). 1 = every rank holds every expert.
    """

    sp: int
    dp: int = 1
    zero_stage: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    checkpointing: str = "none"
    mlp_chunks: int = 1
    loss_chunks: int = 1
    offload_activations: bool = False
    overlap: str = "none"
    offload_optimizer: bool = False
    ring: int = 1
    sequence_chunks: int = 1
    offload_chunks: bool = False
    offload_param: bool = False
    ep: int = 1

    def __post_init__(self):
        counts, flags, read_counts, read_flags = _candidate_knob_kinds()
        if not all(type(value) is int and value >= 1 for value in read_counts(self)):  # a plan's true is no count
            for name in counts:
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive integer, got {value!r}")
        zero = self.zero_stage
        if isinstance(zero, bool) or not isinstance(zero, int) or zero not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.checkpointing not in CHECKPOINTING_POLICIES:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING_POLICIES}, got {self.checkpointing!r}")
        if self.overlap not in OVERLAP_SCHEDULES:
            raise ValueError(f"overlap must be one of {OVERLAP_SCHEDULES}, got {self.overlap!r}")
        for name in () if all(type(value) is bool for value in read_flags(self)) else flags:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        rule = broken(vars(self), _CANDIDATE_RULES)  # the knob couplings a Candidate refuses (contract/rules.py)
        if rule is not None:
            raise ValueError(rule.why(getattr(self, rule.knob)))
        if self.sp % self.ring:
            raise ValueError(f"ring ({self.ring}) must divide sp ({self.sp}): the SP group is ulysses x ring ranks")
        if not isinstance(self.ep, int) or self.ep < 1 or (self.sp * self.dp) % self.ep:
            raise ValueError(f"ep ({self.ep!r}) must be a positive integer dividing sp x dp ({self.sp * self.dp}): "
                             f"the expert-parallel groups are folded onto the ranks holding distinct tokens")

    @property
    def world_size(self) -> int:
        return self.sp * self.dp

    @property
    def ulysses(self) -> int:
        """Ranks of the Ulysses (all-to-all) dimension of the SP group."""
        return self.sp // self.ring

    def short(self) -> str:
        """A compact one-line description for tables."""
        sp = f"sp{self.sp}" if self.ring == 1 else f"sp{self.sp}(u{self.ulysses}xr{self.ring})"
        parts = [sp, f"dp{self.dp}", f"z{self.zero_stage}", f"mb{self.micro_batch}"]
        if self.grad_accum > 1:
            parts.append(f"ga{self.grad_accum}")
        parts.append(f"ckpt:{self.checkpointing}")
        if self.mlp_chunks > 1:
            parts.append(f"mlp/{self.mlp_chunks}")
        if self.loss_chunks > 1:
            parts.append(f"loss/{self.loss_chunks}")
        if self.offload_activations:
            parts.append("offload")
        if self.overlap != "none":
            parts.append(f"overlap:{self.overlap}")
        if self.sequence_chunks > 1:
            parts.append(f"seq/{self.sequence_chunks}")
        if self.offload_chunks:
            parts.append("chunk-offload")
        if self.offload_optimizer:
            parts.append("optim-offload")
        if self.offload_param:
            parts.append("param-offload")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        return " ".join(parts)


_CANDIDATE_RULES = rules_of(CANDIDATE)


@functools.lru_cache(maxsize=None)
def _candidate_knob_kinds() -> tuple:
    """(the counted knobs, the true/false knobs, a getter of each's values) of Candidate's fields, from the knob
    table: read once, since the search validates some hundred candidates per request (cProfile of a 1,000-request
    sweep before: 5.5 s of 53 s in Candidate.__post_init__, most of it these lookups)."""
    knobs = [BY_NAME[f.name] for f in fields(Candidate)]
    counts = tuple(k.name for k in knobs if k.kind is int and not k.values)
    flags = tuple(k.name for k in knobs if k.kind is bool)
    return counts, flags, operator.attrgetter(*counts), operator.attrgetter(*flags)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted peak bytes on one GPU, by component."""

    parameters: float
    gradients: float
    optimizer_states: float
    activations: float
    logits_loss: float
    comm_buffers: float
    reserve: float
    expert_states: float = 0.0
    """Weights, gradients and optimizer states of the routed experts this GPU holds (mixture of experts; the
    other three state fields are the rest of the model)."""

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer_states + self.activations + self.logits_loss
                + self.comm_buffers + self.reserve + self.expert_states)


@dataclass(frozen=True)
class TimeBreakdown:
    """Predicted seconds of one optimizer step on one GPU, by component.

    ``compute`` already contains ``recompute``; the comm fields are the full collective times and
    ``exposed_comm`` is what the overlap schedule leaves on the critical path.
    """

    compute: float
    recompute: float
    attention_comm: float
    zero_comm: float
    offload: float
    exposed_comm: float
    step: float
    expert_comm: float = 0.0
    """The mixture-of-experts dispatch and combine all-to-alls (on the critical path: counted in
    ``exposed_comm`` too)."""


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one candidate."""

    memory: MemoryBreakdown
    time: TimeBreakdown
    capacity_bytes: float
    tokens_per_second: float
    mfu: float
    flops_per_step: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_bytes: float = 0.0
    """Host memory one GPU's process parks there (activation or sequence-chunk offload, ZeRO-Offload's
    optimizer states), bytes; a node needs devices_per_node times this (pinned)."""

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes


__all__ = ["CHECKPOINTING_POLICIES", "COMPILE_BACKENDS", "DTYPES", "OPTIMIZERS", "OVERLAP_SCHEDULES", "AcceleratorSpec", "Candidate",
           "Estimate", "HardwareSpec", "MemoryBreakdown", "ModelSpec", "TimeBreakdown", "Workload", "fingerprint_of",
           "from_dict", "workload_key"]
