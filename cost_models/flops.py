"""FLOPs and memory-bound traffic of one micro-batch on one GPU (docs/cost_model.md, "FLOPs").

Conventions:
- a matmul of an (m x n) by (n x p) is 2mnp FLOPs; backward = 2 x forward (input and weight grads);
- causal attention forward = 2 S^2 q per sequence and layer (QK^T and AV, 2 S^2 q each, halved by
  the causal mask); its *model* FLOPs count backward as 2 x forward (MFU), its *hardware* work counts
  backward as 2.5 x forward (flash attention recomputes QK^T; the FlashAttention papers count it so,
  and attention_efficiency is measured that way);
- pointwise work (norms, RoPE, SiLU, residual adds, casts, softmax of the loss) is memory-bound:
  we count the bytes it moves through HBM, not its FLOPs.
"""

from __future__ import annotations

from autosp.cost_models import linear_attention, moe, ring
from autosp.cost_models.profile import FA_BACKWARD_FACTOR, POLICY_INDEX  # noqa: F401  (re-exported)
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate

OPTIMIZER_BYTES_PER_PARAM = 28.0
"""Adam step traffic per local parameter: read fp32 master, m, v (12) and the gradient (2-4), write
master, m, v (12) and the bf16 weights (2)."""


def matmul_flops_forward(sh: Shapes) -> float:
    """Projections, MLP and LM head of one micro-batch on one GPU (s local tokens)."""
    return 2.0 * sh.s * sh.dense_params


def attention_flops_forward(sh: Shapes, padded: bool = True) -> float:
    """Causal attention forward on one GPU: 1/P of the sequence's causal work. Ulysses: its a / P heads over
    the whole sequence; with a ring, a / U heads over S / R queries, balanced by zigzag sharding (every ring
    rank does exactly 1/R of the causal work; cost_models/ring.py). Packed documents and sliding windows
    compute only their share of that triangle (:func:`ring.attention_steps`, cost_models/documents.py)."""
    S = sh.S_pad if padded else sh.S
    triangle = 2.0 * S * S * sh.attn_width * sh.La * sh.b / sh.P  # the softmax layers (a hybrid's: not its linear ones)
    if not sh.doc_lens and not (0 < sh.window < sh.S_pad and sh.windowed):
        return triangle
    return triangle * ring.attention_steps(sh)[0]


def model_flops(sh: Shapes) -> float:
    """Model FLOPs of one micro-batch on one GPU (MFU numerator): 6 x dense params x real tokens plus
    3 x causal attention forward, on the unpadded sequence, no recompute."""
    real_tokens = sh.S * sh.b / sh.P
    flops = 6.0 * real_tokens * sh.dense_params + 3.0 * attention_flops_forward(sh, padded=False)
    if sh.lin is not None:  # a hybrid's linear-attention cores, forward + backward (2 x), on the real tokens
        flops += 3.0 * linear_attention.core_flops_forward(sh.lin) * sh.S / sh.S_pad
    return flops


def linear_core_flops(sh: Shapes, cand: Candidate) -> tuple[float, float]:
    """(forward, recomputed) FLOPs of a hybrid model's linear-attention cores in one micro-batch on one GPU
    (cost_models/linear_attention.py; 0, 0 without). The op's backward re-runs its forward (its
    ``BWD_FACTOR``, in step_time.py); a full checkpoint re-runs the layer, the op's forward with it."""
    forward = linear_attention.core_flops_forward(sh.lin)
    return forward, forward if cand.checkpointing == "full" else 0.0


def layer_forwards_recomputed(sh: Shapes, cand: Candidate) -> tuple[int, bool]:
    """(layer forwards recomputed without their attention, attention forwards recomputed) per layer.

    Unchunked: ``sequence`` 1 without attention, ``full`` 1 with it (selective / none: pointwise only, 0).
    Sequence-chunked layers (cost_models/chunks.py) always recompute their layer but attention once in their
    backward; under ``full`` the chunked layer is itself recomputed first (attention included)."""
    policy = cand.checkpointing
    if sh.N > 1:
        return (2, True) if policy == "full" else (1, False)
    if policy == "full":
        return 1, True
    return (1, False) if policy == "sequence" else (0, False)


def recompute_flops(sh: Shapes, cand: Candidate) -> tuple[float, float]:
    """(matmul, attention) FLOPs recomputed in the backward of one micro-batch on one GPU.

    selective: pointwise only (see pointwise_bytes); sequence: every layer's projections and MLP
    forward (never attention); full: a whole extra forward of every layer, attention included;
    MLP tiling adds one more MLP forward (each chunk is recomputed in its backward); loss tiling adds
    one more LM-head forward. Sequence-chunked layers: :func:`layer_forwards_recomputed`. A mixture of experts'
    routed experts are recomputed by their op in every case (:func:`moe.recomputed_expert_flops`).
    """
    s, L = sh.s, sh.L
    matmul = 0.0
    attention = 0.0
    forwards, with_attention = layer_forwards_recomputed(sh, cand)
    matmul += forwards * 2.0 * s * L * sh.layer_matmul_params
    if with_attention:
        attention += attention_flops_forward(sh)
    if cand.mlp_chunks > 1:
        matmul += 2.0 * s * L * sh.mlp_params
    else:  # the experts op re-runs its routed experts' forward in its backward (tiled, the line above counts it)
        matmul += moe.recomputed_expert_flops(sh.moe, s)
    if cand.loss_chunks > 1:
        matmul += 2.0 * s * sh.head_matmul_params
    return matmul, attention


def _layer_pointwise_forward_elems(sh: Shapes) -> float:
    """Elements one layer's pointwise forward reads + writes per local token: the profile's model work
    (analytic: two RMSNorms (read h, write h), RoPE on q and k (read, write), SiLU and the gate*up
    product (read f write f; read 2f write f), two residual adds (read 2h write h)) plus the layout
    copies around the all-to-alls (q, k, v in, out back: read + write each)."""
    pw = sh.prof.pw_layer_fwd
    q, k = sh.q, sh.k_eff
    elems = pw.other + pw.kv * sh.kv_copies + 2 * (2 * q + 2 * k)
    if sh.lin is None:
        return elems
    # a hybrid: the mean over the layers, a linear one without attention's RoPE, gate and layout copies, with its own
    linear = elems - linear_attention.attention_pointwise_elems(sh.lin, pw.kv * sh.kv_copies) \
        + linear_attention.pointwise_elems(sh.lin)
    return elems + sh.lin.share * (linear - elems)


def pointwise_bytes(sh: Shapes, cand: Candidate) -> tuple[float, float]:
    """(baseline, recompute) bytes of memory-bound traffic for one micro-batch on one GPU.

    Baseline: forward pointwise work of every layer, ``pw_bwd_factor`` (analytic: twice) that in
    backward, and the loss's softmax and casts over s x V logits (analytic: forward ~14 B, backward
    ~18 B per logit). Recompute: the profile's recomputed pointwise work (analytic: the norms and
    SiLU/product under selective and sequence) or the whole layer's pointwise forward (full), plus the
    loss forward again when it is tiled. A ring adds its merges and copies (:func:`ring.pointwise_bytes`),
    the forward's again under ``full``.
    """
    e, s, L = sh.e, sh.s, sh.L
    p = sh.prof
    layer_fwd = _layer_pointwise_forward_elems(sh) * e * s
    ring_fwd, ring_bwd = ring.pointwise_bytes(sh)
    loss = s * (p.loss_pw_fwd + p.loss_pw_bwd) * e / 2.0
    baseline = (1.0 + p.pw_bwd_factor) * L * layer_fwd + L * s * (ring_fwd + ring_bwd) + loss
    policy = cand.checkpointing
    if sh.N > 1:  # the chunked layer's own recompute of everything but attention; under full the layer again
        recompute = L * layer_fwd + (L * (layer_fwd + s * ring_fwd) if policy == "full" else 0.0)
        policy = "full"  # (its MLP is recomputed with the layer: no separate tiled-MLP recompute)
    elif policy == "full":
        recompute = L * (layer_fwd + s * ring_fwd)
    elif policy in ("selective", "sequence"):
        re = p.pw_recompute[POLICY_INDEX[policy]]
        recompute = L * (re.other + re.kv * sh.kv_copies) * e * s
    else:
        recompute = 0.0
    if cand.mlp_chunks > 1 and policy != "full":
        recompute += L * p.pw_mlp_recompute.other * e * s
    if cand.loss_chunks > 1:
        recompute += s * p.loss_pw_fwd * e / 2.0
    return baseline, recompute


def optimizer_bytes(n_params: float, cand: Candidate) -> float:
    """Adam traffic of one optimizer step on one GPU (ZeRO >= 1 updates only its 1/N_d shard); an offloaded step is
    priced by optimizer_offload.host_step_seconds."""
    local = n_params / (cand.sp * cand.dp) if cand.zero_stage >= 1 else n_params
    return OPTIMIZER_BYTES_PER_PARAM * local


__all__ = ["OPTIMIZER_BYTES_PER_PARAM", "attention_flops_forward", "layer_forwards_recomputed",
           "linear_core_flops", "matmul_flops_forward", "model_flops", "optimizer_bytes", "pointwise_bytes", "recompute_flops"]
