"""What the cost model knows about a model: a :class:`ModelProfile`, from formulas or from a traced graph.

memory.py, flops.py and step_time.py read every model-dependent quantity from a profile (through
:class:`~autosp.cost_models.shapes.Shapes`) instead of from ModelSpec widths:

- :func:`analytic_profile` turns a :class:`ModelSpec` into the profile of the hand-derived Llama-block
  formulas of docs/cost_model.md. The cost model with it is the analytic model, bit for bit.
- :mod:`autosp.profiling.graph` measures the same quantities by tracing the real model under
  FakeTensorMode (docs/graph_profile.md) and returns a profile with ``source == "graph"``.

Units. Per-token activation quantities are :class:`Elems`: elements per local token in the training
dtype (``other``; times e = 2 or 4 bytes), elements of the K/V tensors that Ulysses replicates when
sp > n_kv (``kv``; times the replication factor and e) and bytes that do not depend on the training
dtype (``fixed``: fp32 statistics, integer indices). Matmul work is in *parameter equivalents*:
forward FLOPs per token / 2 (a matmul with p weights costs 2p FLOPs per token). Pointwise traffic
is in 2-byte-element equivalents (bytes at bf16 / 2; the cost model multiplies by e).

Everything here is plain Python (no torch, no numpy): a cache hit of a graph profile must not import
torch, and the planner calls the estimate thousands of times.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache

from autosp.cost_models import moe, softcap
from autosp.contract.specs import CHECKPOINTING_POLICIES, ModelSpec

PROFILE_SCHEMA = 2
"""Bumped whenever the meaning of a field changes; cached graph profiles of another schema are rebuilt."""

POLICY_INDEX = {policy: i for i, policy in enumerate(CHECKPOINTING_POLICIES)}

FA_BACKWARD_FACTOR = 2.5
"""Flash-attention backward work relative to its forward (FlashAttention-2, arXiv 2307.08691): the
backward recomputes QK^T, so five S x S matmuls against the forward's two."""

LOSS_FP32_BYTES = 12
"""Per logit, the fp32 tensors alive at the loss peak besides the logits themselves: log-softmax
output (saved for backward), its incoming gradient and the gradient of the upcast logits (4 B each)."""

FUSED_LOSS_FP32_BYTES = 4
"""Per logit, the fp32 bytes alive at the peak of an untiled loss that Inductor compiled, besides the logits: the
fused log-softmax + NLL keeps only a log-sum-exp per token and its backward writes the gradient of the upcast
logits in one fused kernel (measured: studies/loss_memory.py on the CPU, and the GPU check on an H200, where
the rows without loss tiling held 6 B per bf16 logit at the loss peak, not LOSS_FP32_BYTES + 2 = 14)."""

LOSS_POINTWISE_FWD_BYTES = 14.0
LOSS_POINTWISE_BWD_BYTES = 18.0
"""Memory traffic of the loss per logit at 2-byte logits: forward ~14 B (upcast, log-softmax, NLL
gather), backward ~18 B (NLL and log-softmax backward, downcast)."""


@dataclass(frozen=True)
class Elems:
    """Per-token size: ``other`` + ``kv`` x (KV replication) elements of the training dtype, plus
    ``fixed`` bytes whatever the dtype."""

    other: float = 0.0
    kv: float = 0.0
    fixed: float = 0.0

    def elems(self, kv_copies: int = 1) -> float:
        return self.other + self.kv * kv_copies

    def bytes(self, e: int, kv_copies: int = 1) -> float:
        return (self.other + self.kv * kv_copies) * e + self.fixed

    def __add__(self, o: "Elems") -> "Elems":
        return Elems(self.other + o.other, self.kv + o.kv, self.fixed + o.fixed)


_ELEMS_FIELDS = ("mlp_inner", "mlp_grads", "mlp_phase_grads", "attn_grads", "final", "logits", "loss_peak",
                 "loss_hidden_grad", "pw_layer_fwd", "pw_mlp_recompute")
_ELEMS_TUPLE_FIELDS = ("kept_attn", "kept_mlp", "recompute_mlp_phase", "recompute_attn_phase", "mlp_live",
                       "pw_recompute")


@dataclass(frozen=True)
class ModelProfile:
    """Per-layer, per-token costs of one model (see the module docstring for units).

    Tuples of :class:`Elems` are indexed like ``CHECKPOINTING_POLICIES`` (none, selective, sequence,
    full). ``kept_*`` is what one layer keeps for its backward (attention side incl. the layer input /
    MLP side, which MLP tiling drops); ``recompute_*_phase`` the recomputed tensors alive during the
    MLP / attention part of the layer's backward; ``mlp_live`` the MLP intermediates recomputed (not
    kept); ``mlp_inner`` all of them (MLP tiling keeps 1/N alive); ``*_grads`` the gradients alive in
    each phase (``mlp_grads`` shrinks with MLP tiling, ``mlp_phase_grads`` does not).
    """

    name: str
    source: str                  # "analytic" or "graph"
    n_layers: int
    hidden: int                  # width of the residual stream (a layer's input, per token)
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    # parameters
    n_params: int
    layer_params: int
    layer_small_params: int      # 1-D parameters of a layer (norm weights, biases): ZeRO-3 keeps them gathered
    other_small_params: int      # the same outside the layers (final norm)
    largest_other_params: int    # the largest parameter outside the layers (embedding / LM head matrix)
    # matmul work, parameter equivalents (forward FLOPs per token / 2)
    layer_matmul: float
    mlp_matmul: float
    head_matmul: float
    qproj_matmul: float
    # attention: forward FLOPs per layer and sequence = 2 S^2 attn_width (causal); backward x attn_bwd_factor
    attn_width: float
    # activations
    kept_attn: tuple
    kept_mlp: tuple
    recompute_mlp_phase: tuple
    recompute_attn_phase: tuple
    mlp_live: tuple
    mlp_inner: Elems
    mlp_grads: Elems
    mlp_phase_grads: Elems
    attn_grads: Elems
    final: Elems                 # kept outside the layers (final norm input/output, shared rotary tables)
    # logits and loss
    logits: Elems                # what stays alive of the logits through the layers' backward
    loss_peak: Elems             # alive at the loss peak on top of the layers' kept set
    loss_hidden_grad: Elems      # the hidden-state gradient a tiled loss accumulates
    # memory-bound traffic (2-byte element equivalents per token)
    pw_layer_fwd: Elems          # one layer's pointwise forward, without the Ulysses layout copies
    pw_recompute: tuple          # recomputed pointwise work per policy (full: the whole layer, not read)
    pw_mlp_recompute: Elems      # one more MLP forward (MLP tiling)
    loss_pw_fwd: float           # bytes per token at 2-byte logits
    loss_pw_bwd: float
    # backward / forward ratios
    matmul_bwd_factor: float = 2.0
    attn_bwd_factor: float = FA_BACKWARD_FACTOR
    pw_bwd_factor: float = 2.0
    # provenance
    schema: int = PROFILE_SCHEMA
    fingerprint: str = ""
    versions: tuple = ()         # (("torch", "2.13.0"), ("transformers", "5.2.0"), ...)
    fit_residual: float = 0.0    # the largest relative residual of any fit in the sequence length
    fit: tuple = ()              # ((quantity, relative residual), ...)
    notes: tuple = ()
    details: tuple = ()          # ((key, value), ...): breakdowns for reports, not read by the cost model

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    def policy(self, name: str) -> int:
        return POLICY_INDEX[name]

    def saved_bytes_per_token(self, policy: str, e: int = 2, kv_copies: int = 1, mlp_tiled: bool = False) -> float:
        """Bytes one layer keeps per token under ``policy`` (for reports and tests)."""
        i = POLICY_INDEX[policy]
        kept = self.kept_attn[i].bytes(e, kv_copies)
        if not mlp_tiled:
            kept += self.kept_mlp[i].bytes(e, kv_copies)
        return kept

    def model_spec(self) -> ModelSpec:
        """A ModelSpec with this profile's widths (for plan files and reports; the estimate reads the
        profile). ffn_hidden and gated_mlp are read back from the MLP's matmul work."""
        detail = dict(self.details)
        ffn = int(detail.get("ffn_hidden") or max(1, round(self.mlp_matmul / max(1, 3 * self.hidden))))
        return ModelSpec(name=self.name, n_layers=self.n_layers, hidden=self.hidden, n_heads=self.n_heads,
                         n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, ffn_hidden=ffn, vocab=self.vocab,
                         gated_mlp=bool(detail.get("gated_mlp", True)),
                         tied_embeddings=bool(detail.get("tied_embeddings", False)),
                         qkv_bias=bool(detail.get("qkv_bias", False)), source=self.source)

    # JSON -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelProfile":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown ModelProfile field(s): {', '.join(unknown)}")
        values = dict(data)
        for key in _ELEMS_FIELDS:
            if key in values:
                values[key] = Elems(**values[key])
        for key in _ELEMS_TUPLE_FIELDS:
            if key in values:
                values[key] = tuple(Elems(**v) for v in values[key])
        for key in ("versions", "fit", "details"):
            if key in values:
                values[key] = _freeze(values[key])
        if "notes" in values:
            values["notes"] = tuple(values["notes"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> "ModelProfile":
        return cls.from_dict(json.loads(text))


def mlp_live_per_token(prof: "ModelProfile", policy_index: int, mlp_chunks: int) -> tuple[float, float]:
    """(elements, fixed bytes) per token the MLP holds live during its recompute/backward phase: one tile of
    its inner tensors when the MLP is tiled (``mlp_chunks`` > 1), else the policy's live set."""
    if mlp_chunks > 1:
        return prof.mlp_inner.other / mlp_chunks, prof.mlp_inner.fixed / mlp_chunks
    live = prof.mlp_live[policy_index]
    return live.other, live.fixed


def _freeze(value):
    """JSON lists back to the tuples a frozen profile holds (recursively)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@lru_cache(maxsize=256)
def analytic_profile(model: ModelSpec) -> ModelProfile:
    """The profile of docs/cost_model.md's Llama-block formulas for ``model`` (SwiGLU or plain MLP,
    RMSNorm, GQA, flash attention): the cost model with it reproduces the analytic model exactly.

    h hidden, q = heads x head_dim, k = KV heads x head_dim, f the MLP width, a heads, V vocab:

    ==========  ==================================  ==============  ===========
    policy      kept, attention side                 MLP side        fp32 bytes
    ==========  ==================================  ==============  ===========
    none        x, n1, h1, n2 | q, k, v, O, O'       g, silu, u, p   4a + 8
    selective   x, o_proj out | q, k, v, O, O'       g, u            4a
    sequence    x | q, k, v, O, O'                   -               4a
    full        x                                    -               -
    ==========  ==================================  ==============  ===========
    """
    h, q, k, f, a, V = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden, model.n_heads, model.vocab
    routed = 0.0  # of f, the width the routed experts' op runs: it keeps nothing and recomputes in its backward
    if model.n_experts:  # a mixture of experts is priced as the dense MLP a token runs through (cost_models/moe.py)
        f = moe.mean_active_ffn(model)
        routed = moe.mean_routed_ffn(model)
    mlp = (3 if model.gated_mlp else 2) * h * f + moe.mean_router_params(model)
    lse, rms = 4 * a, 8
    core = q + 2 * q   # q and the two layouts of the attention output (k, v are the kv part)
    # the output gate (Qwen3-Next / Qwen3.5): the q projection's gate half (a matmul output: kept by none and
    # selective) and the gated product the output projection reads (none)
    gate = (2 * q, q, 0, 0) if model.attn_output_gate else (0, 0, 0, 0)
    kept_attn = (Elems(4 * h + core + gate[0], 2 * k, lse + rms), Elems(2 * h + core + gate[1], 2 * k, lse),
                 Elems(h + core, 2 * k, lse), Elems(h, 0, 0))
    kept_mlp = (Elems(4 * (f - routed)), Elems(2 * (f - routed)), Elems(), Elems())
    full_fixed = lse + rms   # full recompute rebuilds the layer's fp32 side tensors too
    re_mlp = (Elems(), Elems(3 * h), Elems(3 * h), Elems(3 * h + 3 * q + gate[0], 2 * k, full_fixed))
    re_attn = (Elems(), Elems(h), Elems(h), Elems(h + 2 * q + gate[0], 2 * k, full_fixed))
    # The MLP's backward as the compiled step runs it (docs/cost_model.md section 12): SiLU and the product are
    # fused and recomputed inside the backward kernel (Inductor; Liger-Kernel's SwiGLU, which ALST ran, does the
    # same), so the MLP holds the gate and up outputs and the down projection's input (3f) plus that input's
    # gradient (f); the gate and up gradients overwrite the gate and up outputs. Unfused eager autograd holds
    # up to 6f (graph profile: the eager upper bound).
    # The routed experts of a mixture of experts (compiler/experts.py) save only their input and rebuild their
    # inner tensors in their own backward under every policy: the recompute phase's live set per unit of width.
    rebuilt = moe.EXPERT_LIVE_PER_WIDTH * routed
    mlp_live = (Elems(rebuilt), Elems(f - routed + rebuilt), Elems(3 * f), Elems(3 * f))
    bias = (q + 2 * k) if model.qkv_bias else 0
    emb = V * h
    capped, cap_fwd, cap_bwd = softcap.logit_extra(model)  # Gemma 2's final-logit soft-capping
    # The softmax-attention layer: its projections (the gate doubles the q projection) and small parameters.
    # A hybrid model's linear-attention layers (cost_models/linear_attention.py) enter the per-layer matmul work and
    # small parameters as the mean over the layers (the cost model multiplies them by the layer count); every other
    # field here describes the softmax-attention layer, which memory.py and step_time.py mix with the linear one.
    qproj = h * q * (2 if model.attn_output_gate else 1)
    attn_matmul, small = qproj + h * q + 2 * h * k, 2 * h + bias + (2 * model.head_dim if model.attn_output_gate else 0)
    if model.linear_layers:
        n_lin = len(model.linear_layers)
        lin_matmul = h * (2 * model.linear_num_key_heads * model.linear_key_head_dim  # q/k/v/z, b/a, out projections
                          + 3 * model.linear_num_value_heads * model.linear_value_head_dim
                          + 2 * model.linear_num_value_heads)
        lin_small = model.linear_attention_params() - lin_matmul - 2 * h  # the conv, A_log, dt_bias, the norm
        attn_matmul = (model.attention_layers * attn_matmul + n_lin * lin_matmul) / model.n_layers
        small = (model.attention_layers * small + n_lin * (2 * h + lin_small)) / model.n_layers
    return ModelProfile(
        name=model.name, source="analytic", n_layers=model.n_layers, hidden=h, n_heads=a,
        n_kv_heads=model.n_kv_heads, head_dim=model.head_dim, vocab=V,
        n_params=model.n_params(), layer_params=model.layer_params(), layer_small_params=small,
        other_small_params=h, largest_other_params=emb,
        layer_matmul=attn_matmul + mlp, mlp_matmul=mlp, head_matmul=emb, qproj_matmul=qproj,
        attn_width=q,
        kept_attn=kept_attn, kept_mlp=kept_mlp, recompute_mlp_phase=re_mlp, recompute_attn_phase=re_attn,
        mlp_live=mlp_live, mlp_inner=Elems(3 * f), mlp_grads=Elems(f), mlp_phase_grads=Elems(2 * h),
        attn_grads=Elems(4 * q + h + (q if model.attn_output_gate else 0), 2 * k), final=Elems(2 * h),
        logits=Elems(V * (1 + capped)), loss_peak=Elems(V * (1 + capped), 0, LOSS_FP32_BYTES * V),
        loss_hidden_grad=Elems(h),
        pw_layer_fwd=Elems(10 * h + 2 * q + 5 * f + (3 * q if model.attn_output_gate else 0), 2 * k),
        pw_recompute=(Elems(), Elems(4 * h + 4 * f), Elems(4 * h + 4 * f), Elems()),
        pw_mlp_recompute=Elems(3 * f),
        loss_pw_fwd=(LOSS_POINTWISE_FWD_BYTES + cap_fwd) * V, loss_pw_bwd=(LOSS_POINTWISE_BWD_BYTES + cap_bwd) * V,
        fingerprint=model.fingerprint(),
        details=(("ffn_hidden", model.ffn_hidden), ("gated_mlp", model.gated_mlp), ("tied_embeddings", model.tied_embeddings),
                 ("qkv_bias", model.qkv_bias)),
    )


__all__ = ["Elems", "FA_BACKWARD_FACTOR", "LOSS_FP32_BYTES", "LOSS_POINTWISE_BWD_BYTES",
           "LOSS_POINTWISE_FWD_BYTES", "ModelProfile", "POLICY_INDEX", "PROFILE_SCHEMA", "analytic_profile",
           "mlp_live_per_token"]
