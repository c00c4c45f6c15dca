"""Per-GPU tensor shapes of one Ulysses training step: the quantities every other module shares.

Nothing here allocates or imports torch; :func:`shapes` validates a candidate against the model
(query/KV head divisibility, docs/design.md section 2) and returns plain numbers.
"""

from __future__ import annotations

import math

from autosp.cost_models.profile import ModelProfile, analytic_profile
from autosp.cost_models.specs import Candidate, ModelSpec, Workload

BYTES = {"bf16": 2, "fp32": 4}


class Shapes:
    """Derived sizes for (model, workload, candidate). Element counts unless named ``*_bytes``.

    - ``S``: real sequence length; ``S_pad``: padded to a multiple of the SP degree P (pad tokens
      carry ignored labels and are masked, never dropped).
    - ``s``: tokens each GPU holds between all-to-alls = S_pad / P x micro_batch.
    - ``q``/``k``: query and KV widths (heads x head_dim); ``k_eff``: the KV width per local token
      after Ulysses' head replication, max(n_kv, P) x head_dim when P > 1 (when P > n_kv each KV
      head is copied P / n_kv times before the all-to-all so every rank gets the KV head its query
      heads use); ``kv_copies`` = k_eff / k.
    - ``e``: bytes per activation/parameter element (2 for bf16, 4 for fp32).
    - ``prof``: the :class:`~autosp.cost_models.profile.ModelProfile` every per-token cost comes from
      (:func:`~autosp.cost_models.profile.analytic_profile` of ``model`` unless one is given); the
      widths, heads and parameter counts below are the profile's.
    """

    __slots__ = ("S", "S_pad", "P", "b", "s", "e", "h", "q", "k", "k_eff", "V", "L", "a", "d",
                 "n_kv", "kv_copies", "local_heads", "layer_matmul_params", "mlp_params",
                 "lm_head_params", "head_matmul_params", "dense_params", "n_params", "layer_params", "prof",
                 "attn_width", "qproj_params")

    def __init__(self, model: ModelSpec, workload: Workload, cand: Candidate, profile: ModelProfile | None = None):
        prof = analytic_profile(model) if profile is None else profile
        P = cand.sp
        a, n_kv = prof.n_heads, prof.n_kv_heads
        if a % P:
            raise ValueError(f"sp={P} does not divide the {a} query heads of {model.name}")
        if P > 1 and n_kv % P and P % n_kv:
            raise ValueError(f"sp={P} neither divides nor is a multiple of the {n_kv} KV heads of {model.name}")
        self.prof = prof
        self.P = P
        self.S = workload.seq_len
        self.S_pad = math.ceil(workload.seq_len / P) * P
        self.b = cand.micro_batch
        self.s = self.S_pad // P * cand.micro_batch
        self.e = BYTES[workload.dtype]
        self.h = prof.hidden
        self.d = d = prof.head_dim
        self.q = a * d
        self.k = n_kv * d
        self.n_kv = n_kv
        self.kv_copies = P // n_kv if P > n_kv else 1
        self.k_eff = max(n_kv, P) * d if P > 1 else self.k
        self.V = prof.vocab
        self.L = prof.n_layers
        self.a = a
        self.local_heads = a // P
        # matmul work in parameter equivalents (forward FLOPs per token / 2); the embedding lookup is a
        # gather, not a matmul; tied embeddings still run the head matmul
        self.mlp_params = prof.mlp_matmul
        self.layer_matmul_params = prof.layer_matmul
        self.head_matmul_params = prof.head_matmul
        self.dense_params = prof.n_layers * prof.layer_matmul + prof.head_matmul
        self.qproj_params = prof.qproj_matmul
        self.attn_width = prof.attn_width
        # parameter counts (model states, ZeRO-3 gathering)
        self.lm_head_params = prof.largest_other_params
        self.layer_params = prof.layer_params
        self.n_params = prof.n_params


def shapes(model: ModelSpec, workload: Workload, cand: Candidate, profile: ModelProfile | None = None) -> Shapes:
    return Shapes(model, workload, cand, profile)
