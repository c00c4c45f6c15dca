"""Per-GPU tensor shapes of one sequence-parallel training step: the quantities every other module shares.

The SP group of P = ``sp`` ranks is U Ulysses ranks x R ring ranks (``Candidate.ulysses`` x ``ring``; R = 1
is pure Ulysses). Nothing here allocates or imports torch; :func:`shapes` validates a candidate against the
model (query/KV head divisibility over the Ulysses degree U, docs/design.md section 2) and returns plain numbers.
"""

from __future__ import annotations

import math

from autosp.cost_models import linear_attention
from autosp.cost_models.moe import layout as moe_layout
from autosp.cost_models.profile import ModelProfile, analytic_profile
from autosp.contract.specs import Candidate, ModelSpec, Workload

BYTES = {"bf16": 2, "fp32": 4}


def padding_multiple(cand: Candidate) -> int:
    """The sequence is padded to a multiple of this: sp for pure Ulysses; with a ring, of both sp and 2R
    (zigzag sharding cuts the sequence in 2R chunks; each ring position's two chunks are split over its U
    Ulysses ranks), the multiple the compiler pads to."""
    if cand.ring == 1:
        return cand.sp
    return cand.sp * 2 * cand.ring // math.gcd(cand.sp, 2 * cand.ring)


class Shapes:
    """Derived sizes for (model, workload, candidate). Element counts unless named ``*_bytes``.

    - ``P``, ``U``, ``R``: SP degree, its Ulysses and ring degrees (P = U x R).
    - ``S``: real sequence length; ``S_pad``: padded to a multiple of :func:`padding_multiple` (P, or lcm(P, 2R)
      with a ring; pad tokens carry ignored labels and are masked, never dropped).
    - ``s``: tokens each GPU holds between all-to-alls = S_pad / P x micro_batch. After the all-to-all a
      rank holds S_pad / R tokens x H / U heads: the same number of elements as s tokens x all heads, so
      every per-token width below is per *local* token either way.
    - ``q``/``k``: query and KV widths (heads x head_dim); ``k_eff``: the KV width per local token
      after Ulysses' head replication, max(n_kv, U) x head_dim (when U > n_kv each KV head is copied
      U / n_kv times before the all-to-all so every rank gets the KV head its query heads use; the ring
      needs no copies); ``kv_copies`` = k_eff / k.
    - ``e``: bytes per activation/parameter element (2 for bf16, 4 for fp32).
    - ``N``: ``sequence_chunks``, the chunks each decoder layer runs its local tokens in; ``c``: tokens of one
      chunk, ceil(s / N) (= s unchunked; cost_models/chunks.py).
    - ``doc_lens``: the workload's packed-document histogram (empty: unpacked); ``window``, ``windowed``: the
      model's sliding window and how many of its layers use it (0, 0: all global). Attention FLOPs and time
      follow them (cost_models/documents.py); nothing per token does.
    - ``moe``: the model's :class:`~autosp.cost_models.moe.MoeShape` under the candidate's ``ep`` (None: dense);
      ``model``: the ModelSpec itself.
    - ``lin``: the model's :class:`~autosp.cost_models.linear_attention.LinearShape` (None without linear-attention
      layers); ``La``: the layers that run softmax attention (L without linear layers). Attention FLOPs and the
      attention all-to-alls are per softmax layer; per-layer kept sets and matmul work are means over the layers.
    - ``prof``: the :class:`~autosp.cost_models.profile.ModelProfile` every per-token cost comes from
      (:func:`~autosp.cost_models.profile.analytic_profile` of ``model`` unless one is given); the
      widths, heads and parameter counts below are the profile's.
    """

    __slots__ = ("S", "S_pad", "P", "U", "R", "b", "s", "e", "h", "q", "k", "k_eff", "V", "L", "a", "d",
                 "n_kv", "kv_copies", "local_heads", "layer_matmul_params", "mlp_params",
                 "lm_head_params", "head_matmul_params", "dense_params", "n_params", "layer_params", "prof",
                 "attn_width", "qproj_params", "N", "c", "doc_lens", "window", "windowed", "attention", "moe", "model",
                 "fused_loss", "lin", "La")

    def __init__(self, model: ModelSpec, workload: Workload, cand: Candidate, profile: ModelProfile | None = None):
        prof = analytic_profile(model) if profile is None else profile
        P, U, R = cand.sp, cand.ulysses, cand.ring
        a, n_kv = prof.n_heads, prof.n_kv_heads
        degree = f"sp={P}" if R == 1 else f"the Ulysses degree {U} (sp={P} / ring={R})"
        if a % U:
            raise ValueError(f"{degree} does not divide the {a} query heads of {model.name}")
        if U > 1 and n_kv % U and U % n_kv:
            raise ValueError(f"{degree} neither divides nor is a multiple of the {n_kv} KV heads of {model.name}")
        self.prof = prof
        self.P, self.U, self.R = P, U, R
        self.S = workload.seq_len
        multiple = padding_multiple(cand)
        self.S_pad = math.ceil(workload.seq_len / multiple) * multiple
        self.b = cand.micro_batch
        self.s = self.S_pad // P * cand.micro_batch
        self.N = cand.sequence_chunks
        self.c = math.ceil(self.s / self.N)
        self.e = BYTES[workload.dtype]
        self.h = prof.hidden
        self.d = d = prof.head_dim
        self.q = a * d
        self.k = n_kv * d
        self.n_kv = n_kv
        self.kv_copies = U // n_kv if U > n_kv else 1
        self.k_eff = max(n_kv, U) * d
        self.V = prof.vocab
        self.L = prof.n_layers
        self.a = a
        self.local_heads = a // U
        # matmul work in parameter equivalents (forward FLOPs per token / 2); the embedding lookup is a
        # gather, not a matmul; tied embeddings still run the head matmul
        self.mlp_params = prof.mlp_matmul
        self.layer_matmul_params = prof.layer_matmul
        self.head_matmul_params = prof.head_matmul
        self.dense_params = prof.n_layers * prof.layer_matmul + prof.head_matmul
        self.qproj_params = prof.qproj_matmul
        self.attn_width = prof.attn_width
        self.doc_lens = workload.doc_lens
        self.fused_loss = workload.compile_backend == "inductor"  # an untiled loss is one fused kernel
        self.window = model.sliding_window
        self.windowed = min(model.windowed_layers, prof.n_layers)
        self.attention = None  # (work, ring steps), computed once by ring.attention_steps
        # parameter counts (model states, ZeRO-3 gathering)
        self.lm_head_params = prof.largest_other_params
        self.layer_params = prof.layer_params
        self.n_params = prof.n_params
        self.model = model
        # mixture of experts: experts, top-k and the EP degree (None for a dense model; cost_models/moe.py)
        self.moe = moe_layout(model, cand)
        # Gated DeltaNet layers (None without: cost_models/linear_attention.py); the FLA kernel a GPU plan runs
        self.lin = linear_attention.layout(model, cand, self.s, self.S_pad, self.e, self.q, self.k_eff)
        self.La = self.L - (self.lin.layers if self.lin is not None else 0)


def shapes(model: ModelSpec, workload: Workload, cand: Candidate, profile: ModelProfile | None = None) -> Shapes:
    return Shapes(model, workload, cand, profile)


__all__ = ["BYTES", "Shapes", "padding_multiple", "shapes"]
