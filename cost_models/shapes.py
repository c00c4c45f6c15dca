"""Per-GPU tensor shapes of one Ulysses training step: the quantities every other module shares.

Nothing here allocates or imports torch; :func:`shapes` validates a candidate against the model
(query/KV head divisibility, design.md section 2) and returns plain numbers.
"""

from __future__ import annotations

import math

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
      heads use).
    - ``e``: bytes per activation/parameter element (2 for bf16, 4 for fp32).
    """

    __slots__ = ("S", "S_pad", "P", "b", "s", "e", "h", "q", "k", "k_eff", "f", "V", "L", "a", "d",
                 "n_kv", "kv_copies", "local_heads", "gated", "layer_matmul_params", "mlp_params",
                 "lm_head_params", "dense_params", "n_params", "layer_params", "qkv_bias")

    def __init__(self, model: ModelSpec, workload: Workload, cand: Candidate):
        P = cand.sp
        a, n_kv = model.n_heads, model.n_kv_heads
        if a % P:
            raise ValueError(f"sp={P} does not divide the {a} query heads of {model.name}")
        if P > 1 and n_kv % P and P % n_kv:
            raise ValueError(f"sp={P} neither divides nor is a multiple of the {n_kv} KV heads of {model.name}")
        self.P = P
        self.S = workload.seq_len
        self.S_pad = math.ceil(workload.seq_len / P) * P
        self.b = cand.micro_batch
        self.s = self.S_pad // P * cand.micro_batch
        self.e = BYTES[workload.dtype]
        self.h = model.hidden
        self.d = model.head_dim
        self.q = a * model.head_dim
        self.k = n_kv * model.head_dim
        self.n_kv = n_kv
        self.kv_copies = P // n_kv if P > n_kv else 1
        self.k_eff = max(n_kv, P) * model.head_dim if P > 1 else model.kv_dim
        self.f = model.ffn_hidden
        self.V = model.vocab
        self.L = model.n_layers
        self.a = a
        self.local_heads = a // P
        self.gated = model.gated_mlp
        h = model.hidden
        self.mlp_params = (3 if model.gated_mlp else 2) * h * model.ffn_hidden
        self.layer_matmul_params = 2 * h * model.q_dim + 2 * h * model.kv_dim + self.mlp_params
        self.lm_head_params = model.vocab * h
        # Matmul parameters of one forward: every layer's projections and MLP plus the LM head (the
        # embedding lookup is a gather, not a matmul). Tied embeddings still run the head matmul.
        self.dense_params = model.n_layers * self.layer_matmul_params + self.lm_head_params
        # same arithmetic as ModelSpec.layer_params() / n_params(), inlined: this runs on every estimate
        self.qkv_bias = model.qkv_bias
        self.layer_params = self.layer_matmul_params + 2 * h + ((self.q + 2 * self.k) if model.qkv_bias else 0)
        self.n_params = (model.n_layers * self.layer_params
                         + self.lm_head_params * (1 if model.tied_embeddings else 2) + h)


def shapes(model: ModelSpec, workload: Workload, cand: Candidate) -> Shapes:
    return Shapes(model, workload, cand)
