"""Sequence-chunked decoder layers (``sequence_chunks``) and their host-offloaded chunks (``offload_chunks``).

Each decoder layer runs over the rank's s local tokens in N = ``sequence_chunks`` chunks of c = ceil(s / N)
tokens, forward and backward: token-wise ops (norms, projections, MLP, residual adds) one chunk at a time;
the Ulysses all-to-alls per chunk; attention of chunk i over the key/value chunks j <= i, merged by their
log-sum-exp (the idea of DeepSpeed's FPDT, Yao et al., arXiv 2408.16978). docs/cost_model.md ("Sequence-chunked
layers") derives every term; the short version, per layer:

- **What a chunked layer keeps** (the layer is one op with its own rule, checkpointed like attention: kept under
  ``none``/``selective``/``sequence``, recomputed under ``full``): per chunk its token-wise inputs (the layer
  input x, h), its keys and values (2k'), the merged attention output (q) and its fp32 log-sum-exp (4a bytes);
  everything else is recomputed in its backward, one chunk at a time: the cost of ``full`` checkpointing
  without recomputing attention. Under ``full`` only the layer input is kept (activation offload moves it), and
  the layer's backward first re-runs its chunked forward, which keeps its set for that one layer.
- **What becomes one chunk**: the recomputed layer of one chunk with its gradients (the ``full`` policy's
  backward working set, for c tokens), the all-to-all staging buffers, a ring's buffers.
- **What stays full-length**: the layer's output gradient and the input gradient being assembled (2h per token),
  the kept sets of all layers, and the dK/dV accumulators (every later query chunk adds to them; fp32, like the
  ring's), plus fp32 accumulators of the layer's weight gradients (summed over the chunks) and one chunk's
  weight gradients being added to them.
- **offload_chunks** moves the kept chunks and the backward's dK/dV accumulators to host memory; the device
  holds prefetch buffers: two chunks of one layer's kept set (the one in use, the next arriving), two K/V
  chunks and two fp32 dK/dV chunks (one in use, one in flight).

Time: attention in N x N blocks (smaller, slower kernels: the block-efficiency model of cost_models/ring.py),
N-fold all-to-all and ring latencies, a fixed cost per chunk and pass, and with offload the host<->device copies
(:func:`offload_pass_bytes`) overlapped with the pass's compute on a side stream.

Pure functions over :class:`~autosp.cost_models.shapes.Shapes` and plain floats; every term is zero or one for
N = 1, so unchunked layers are priced exactly as before.
"""

from __future__ import annotations

import math

from autosp.cost_models import profile, ring
from autosp.cost_models.profile import POLICY_INDEX
from autosp.cost_models.shapes import Shapes

__all__ = ["ACCUMULATOR_BYTES", "CHUNK_KV_BUFFERS", "CHUNK_SAVED_BUFFERS", "RECOMPUTE_POLICY", "compute_factor",
           "full_length_grad_elems", "host_bytes", "kept_on_device", "kv_elems", "offload_exposed", "offload_pass_bytes",
           "saved_bytes_per_token", "transient_bytes", "transfer_seconds"]

RECOMPUTE_POLICY = "full"
"""A chunked layer's backward recomputes one chunk of the whole layer but its attention: its working set is the
``full`` policy's for c tokens (the profile's phases), and its recompute work that of ``full`` minus attention."""

CHUNK_SAVED_BUFFERS = 2
"""With offload_chunks, chunks of one layer's kept set on the device in the backward: the one in use and the
next one arriving (prefetched one chunk ahead on a side stream)."""

CHUNK_KV_BUFFERS = 2
"""With offload_chunks, K/V chunks (and fp32 dK/dV accumulator chunks) on the device in the attention of one
query chunk: the one computed on and the next one arriving (or the previous one leaving)."""

ACCUMULATOR_BYTES = ring.DKV_BYTES
"""dK/dV are summed over up to N query chunks; like the ring's accumulators they are fp32 whatever the
training dtype (the chunks' partial gradients are added in fp32 so the sum is exact to fp32 rounding)."""


def kv_elems(sh: Shapes) -> float:
    """K and V elements per local token after the all-to-all (2k', Ulysses' KV replication included)."""
    return 2.0 * sh.k_eff


def full_length_grad_elems(sh: Shapes) -> float:
    """Residual-stream gradient elements per local token alive through a chunked layer's whole backward: the
    profile's MLP-phase gradients (analytic: the layer's output gradient and its input gradient, 2h)."""
    return sh.prof.mlp_phase_grads.other


def compute_factor(sh: Shapes) -> float:
    """Attention time / the same FLOPs at the whole-sequence causal speed, with N chunks (and a ring).

    Without a ring the rank's causal attention over S_pad tokens (its heads) splits into N diagonal blocks
    (causal, n = S_pad / N tokens) and N(N-1)/2 unmasked n x n blocks: work N n^2/2 + N(N-1)/2 n^2 = (N n)^2/2,
    the same as unchunked, so the time factor is (1/g_d + (N-1)/g_o) / N with the block speeds g of
    :func:`ring.kernel_speed` (exactly the ring's form). With a ring each of its 2R zigzag chunks is cut N times
    more: priced as R x N steps of blocks of S_pad / (2RN) tokens (an approximation: the diagonal steps are
    counted once per ring step and chunk). N = 1 gives :func:`ring.compute_factor`.

    Packed documents and sliding windows already run their attention in per-document (per-band) pieces, the
    factor :func:`ring.compute_factor` prices; chunk boundaries cut those pieces again only where a piece
    crosses one. The larger of the two factors is taken: right at both ends (documents much shorter than a
    chunk: the chunks add almost no cut; one document per sequence: the chunk factor), a little optimistic in
    between (docs/cost_model.md section 14)."""
    N = sh.N
    unchunked = ring.compute_factor(sh)
    if N == 1:
        return unchunked
    base = ring.kernel_speed(sh.S_pad, ring.CAUSAL_HALF_TOKENS)
    if sh.R == 1:
        n = sh.S_pad / N
        diag = ring.kernel_speed(n, ring.CAUSAL_HALF_TOKENS) / base
        off = min(1.0, ring.kernel_speed(n, ring.FULL_HALF_TOKENS) / base)
        chunked = (1.0 / diag + (N - 1) / off) / N
    else:
        c = sh.S_pad / (2 * sh.R * N)
        diag = ring.kernel_speed(2 * c, ring.CAUSAL_HALF_TOKENS) / base
        off = min(1.0, ring.kernel_speed(c, ring.FULL_HALF_TOKENS) / base)
        steps = sh.R * N
        chunked = (1.0 / diag + (steps - 1) / off) / steps
    restricted = sh.doc_lens or (0 < sh.window < sh.S_pad and sh.windowed)
    return max(chunked, unchunked) if restricted else chunked


def saved_bytes_per_token(sh: Shapes) -> float:
    """Bytes one chunked layer keeps per local token, whatever the policy: the layer input (h), K and V (2k'),
    the merged attention output (q), in the training dtype, and the fp32 log-sum-exp (one per local head)."""
    return (sh.h + kv_elems(sh) + sh.q) * sh.e + 4.0 * sh.a


def transient_bytes(sh: Shapes, mlp_chunks: int, offload: bool) -> float:
    """Bytes one chunked layer holds on top of the kept sets during its backward (docs/cost_model.md,
    "Sequence-chunked layers").

    One chunk (c tokens): the larger of the ``full`` policy's MLP and attention phases of
    memory.layer_transient_phases (the chunk's layer recomputed with autograd) without their residual-gradient
    part; the ring's backward buffers. Full-length (s tokens): the residual gradients (2h); without offload the
    fp32 dK/dV accumulators (2k' x 4), with offload CHUNK_KV_BUFFERS chunks each of K/V and of accumulators.
    Plus the layer's weight gradients: their fp32 accumulators (summed over the chunks, whatever the training
    dtype: the op allocates them afresh, apart from the parameters' .grad) and one chunk's gradients in the
    training dtype, alive while they are added (and, for 16-bit weights, the copy the op returns)."""
    p = sh.prof
    i = POLICY_INDEX[RECOMPUTE_POLICY]
    e, c, s = sh.e, sh.c, sh.s
    copies = sh.kv_copies
    re_mlp, re_attn, grads = p.recompute_mlp_phase[i], p.recompute_attn_phase[i], p.attn_grads
    mlp_live, live_fixed = profile.mlp_live_per_token(p, i, mlp_chunks)
    residual = full_length_grad_elems(sh)
    mlp_chunk = (re_mlp.other + re_mlp.kv * copies + mlp_live + p.mlp_grads.other / mlp_chunks) * e
    mlp_chunk += re_mlp.fixed + live_fixed + p.mlp_grads.fixed / mlp_chunks + p.mlp_phase_grads.fixed
    # attn_grads holds dO, dq, the fp32 dq accumulator, dk, dv and (analytic) the residual gradient h, which
    # the full-length term already counts
    attn_chunk = (re_attn.other + re_attn.kv * copies + max(0.0, grads.other - p.hidden) + grads.kv * copies) * e
    attn_chunk += re_attn.fixed + grads.fixed + ring.backward_extra_bytes(sh)
    kv = kv_elems(sh)
    if offload:
        state = CHUNK_KV_BUFFERS * c * kv * (e + ACCUMULATOR_BYTES)
    else:
        state = s * kv * ACCUMULATOR_BYTES
    weight_grads = (ACCUMULATOR_BYTES + e) * sh.layer_params
    return s * residual * e + state + c * max(mlp_chunk, attn_chunk) + weight_grads


def kept_on_device(per_layer: float, L: int, N: int, offload: bool) -> float:
    """Bytes of the layers' kept sets on the device: all L layers', or with offload_chunks CHUNK_SAVED_BUFFERS
    chunks of one layer's."""
    if not offload:
        return L * per_layer
    return min(CHUNK_SAVED_BUFFERS, N) * per_layer / N


def host_bytes(sh: Shapes, per_layer: float) -> float:
    """Pinned host bytes per GPU with offload_chunks: every layer's kept chunks and the fp32 dK/dV accumulators
    of the layer in its backward."""
    return sh.L * per_layer + sh.s * kv_elems(sh) * ACCUMULATOR_BYTES


def offload_pass_bytes(sh: Shapes, per_layer: float) -> tuple[float, float, float, float]:
    """(forward H2D, forward D2H, backward H2D, backward D2H) bytes of one layer with offload_chunks.

    Forward: the kept chunks go down (per_layer D2H); query chunk i reads K/V chunks j < i back (its own is still
    on the device): N(N-1)/2 K/V chunks H2D. Backward (query chunks last to first): the kept chunks but their K/V
    come back one chunk ahead; query chunk i reads K/V chunks j <= i and their fp32 dK/dV accumulators, adds its
    share and writes them back: N(N+1)/2 x (K/V + accumulator) H2D and N(N+1)/2 accumulators D2H."""
    N, c, e = sh.N, sh.c, sh.e
    kv_chunk = c * kv_elems(sh) * e
    acc_chunk = c * kv_elems(sh) * ACCUMULATOR_BYTES
    lower = N * (N - 1) / 2.0
    pairs = N * (N + 1) / 2.0
    fwd_h2d, fwd_d2h = lower * kv_chunk, per_layer
    bwd_h2d = max(0.0, per_layer - sh.s * kv_elems(sh) * e) + pairs * (kv_chunk + acc_chunk)
    bwd_d2h = pairs * acc_chunk
    return fwd_h2d, fwd_d2h, bwd_h2d, bwd_d2h


def transfer_seconds(h2d: float, d2h: float, link: float, dram_per_gpu: float) -> float:
    """Seconds to move ``h2d`` and ``d2h`` bytes concurrently: each direction at the host link's effective
    one-way bandwidth, and both together through the GPU's share of the node's host DRAM bandwidth (eight GPUs
    at PCIe Gen5 speed ask more of the host than its DRAM sustains)."""
    if h2d <= 0 and d2h <= 0:
        return 0.0
    if link <= 0 or dram_per_gpu <= 0:
        return math.inf
    return max(h2d / link, d2h / link, (h2d + d2h) / dram_per_gpu)


def offload_exposed(sh: Shapes, per_layer: float, t_fwd_layer: float, t_bwd_layer: float, link: float,
                    dram_per_gpu: float, recomputed: bool = False) -> tuple[float, float]:
    """(copy seconds, exposed seconds) of one layer's forward and backward with offload_chunks.

    The copies run on a side stream one chunk ahead of the compute of the same pass, so a pass's copies hide
    behind its compute (``t_fwd_layer``; ``t_bwd_layer`` = backward + recompute) except where they outlast it;
    the backward's first chunk of the kept set has nothing to hide behind. ``recomputed`` (policy ``full``):
    the chunked forward runs again inside the backward, its copies with it."""
    fwd_h2d, fwd_d2h, bwd_h2d, bwd_d2h = offload_pass_bytes(sh, per_layer)
    if recomputed:  # under full the chunked forward runs again in the backward, with its copies
        bwd_h2d, bwd_d2h = bwd_h2d + fwd_h2d, bwd_d2h + fwd_d2h
    t_fwd = transfer_seconds(fwd_h2d, fwd_d2h, link, dram_per_gpu)
    t_bwd = transfer_seconds(bwd_h2d, bwd_d2h, link, dram_per_gpu)
    first = transfer_seconds(per_layer / sh.N, 0.0, link, dram_per_gpu)
    exposed = max(0.0, t_fwd - t_fwd_layer) + max(0.0, t_bwd - t_bwd_layer) + first
    return t_fwd + t_bwd, exposed
