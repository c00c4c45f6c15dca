"""Ring attention, the R dimension of 2-D sequence parallelism: P2P traffic, overlap, block efficiency, buffers.

The SP group of P = ``sp`` ranks is U = ``ulysses`` x R = ``ring`` ranks (autosp/contract/specs.py): Ulysses
all-to-alls over U consecutive ranks turn each rank's S/P tokens x all heads into S/R tokens x H/U heads;
the ring then passes key/value blocks around the R ranks (ranks strided by U), R - 1 steps, each step's
transfer overlapping the attention of the block already there, and merges the partial outputs by their
log-sum-exp. docs/cost_model.md ("Ring attention") derives every term; the short version:

- **Sharding** (zigzag / head-tail): the sequence is cut in 2R chunks of c = S_pad / 2R tokens and ring rank r
  holds chunks r and 2R-1-r, so every ring rank does exactly 2c^2 (per head) of causal work in each of its R
  steps: step 0 is its own two chunks (causal), every other step two full c x c blocks. S is padded to a
  multiple of 2 x sp (2R chunks, each split over U ranks): :func:`~autosp.cost_models.shapes.padding_multiple`.
- **Volumes** per layer and rank: a K/V block is the rank's S/R tokens x its KV heads (k and v), i.e.
  2 s k' e bytes with s = S_pad/P local tokens and k' the KV width per local token (Shapes.k_eff). Forward:
  R-1 blocks. Backward: R-1 K/V blocks again plus R fp32 dK/dV accumulators (each visits every ring rank once
  and returns to its owner). ``full`` recompute repeats the forward's R-1.
- **Link**: a ring inside a node uses NVLink; a ring of an SP group spanning nodes has at least one hop per
  node on the scale-out network, and every step waits for its slowest hop, so the whole ring runs at the
  per-GPU inter-node bandwidth and latency.
- **Overlap**: the transfer for step i+1 runs under the attention of step i (the first step computes the
  rank's own block, so nothing waits at the start); in the backward the dK/dV accumulator of step i travels
  under step i+1, and the last one's hop home has nothing to hide behind.

Pure functions over :class:`~autosp.cost_models.shapes.Shapes` and plain floats; everything is zero / one for
R = 1, so pure Ulysses is priced exactly as before.
"""

from __future__ import annotations

from autosp.cost_models import documents
from autosp.cost_models.shapes import Shapes, padding_multiple
from autosp.contract.specs import Candidate, HardwareSpec

__all__ = ["CAUSAL_HALF_TOKENS", "FULL_HALF_TOKENS", "DKV_BYTES", "RING_DKV_BUFFERS", "RING_KV_BUFFERS",
           "attention_steps", "backward_extra_bytes", "block_speeds", "compute_factor", "dkv_block_bytes", "exposed_backward",
           "exposed_forward", "forward_extra_bytes", "kernel_speed", "kv_block_bytes", "layer_times", "link",
           "padding_multiple", "pointwise_bytes", "sequence_policy_without_all_to_all", "spans_nodes",
           "transfer_times"]

# --- block efficiency -------------------------------------------------------------------------------
CAUSAL_HALF_TOKENS = 534.0
FULL_HALF_TOKENS = 194.0
"""Flash attention's speed over a sequence of n tokens, relative to its long-sequence speed, is modelled as
n / (n + n_half): a fixed per-call and per-row-block cost amortised over the kernel's length. n_half is
fitted (least squares on 1/speed) to FlashAttention-2's published forward+backward benchmark on an H100 80GB
SXM5 at head dimension 128 (Dao-AILab/flash-attention, assets/flash2_h100_fwd_bwd_benchmark.png, shipped with
the FlashAttention-2 release, arXiv 2307.08691): with the causal mask 163, 221, 265, 294, 308, 328 TFLOP/s at
0.5k-16k tokens -> n_half = 534 (fitted asymptote 334 TFLOP/s, every point within 1.7%); without it 248,
294, 320, 326, 335, 338 -> n_half = 194 (asymptote 345, within 1.6%). A ring step's kernel is shorter than
the whole sequence Ulysses' kernel runs over, so it is slower by the ratio of the two. An assumption for
other accelerators (and for CPUs) until a measured row says otherwise."""

# --- buffers ------------------------------------------------------------------------------------------
RING_KV_BUFFERS = 2
"""K/V blocks alive besides the rank's own (kept) K/V while the ring runs: the block being computed on and
the next one arriving (double buffering)."""

RING_DKV_BUFFERS = 2
"""dK/dV accumulators alive in the backward: the one arriving from the previous rank (to which this rank
adds its share) and the one still in flight to the next."""

DKV_BYTES = 4
"""dK/dV (and dQ) are accumulated across ring steps in fp32 (the sum of R partial gradients), whatever the
training dtype; the dK/dV accumulator travels as fp32."""


def kernel_speed(tokens: float, half: float) -> float:
    """Relative speed of flash attention over ``tokens`` tokens (1 at infinite length)."""
    return tokens / (tokens + half) if tokens > 0 else 0.0


def block_speeds(sh: Shapes) -> tuple[float, float]:
    """(diagonal step, off-diagonal step) attention speed relative to the causal kernel over the whole padded
    sequence, which is what ``attention_efficiency`` prices (so R = 1 gives (1, 1) exactly).

    Step 0 runs causal attention over the rank's own 2c tokens; every other step runs two unmasked c x c
    blocks as one call (2c queries over c keys, or c queries over 2c keys), priced at the slower, c-key
    shape. An unmasked block is capped at the causal kernel's speed: the benchmark's 3% edge of unmasked
    kernels at 16k is within its spread, and a ring block is never modelled faster than what it replaces.
    """
    if sh.R == 1:
        return 1.0, 1.0
    c = sh.S_pad / (2 * sh.R)
    base = kernel_speed(sh.S_pad, CAUSAL_HALF_TOKENS)
    diag = kernel_speed(2 * c, CAUSAL_HALF_TOKENS) / base
    off = min(1.0, kernel_speed(c, FULL_HALF_TOKENS) / base)
    return diag, off


def attention_steps(sh: Shapes) -> tuple[float, tuple]:
    """(work, step times) of one layer's attention, averaged over the model's layers: ``work`` is its FLOPs
    over the S_pad^2 causal triangle's (below 1 with packed documents or a sliding window), ``steps`` each
    ring step's time (one entry without a ring) in units of the rank's share of the triangle at the
    whole-sequence kernel speed (cost_models/documents.py). Unpacked, unwindowed: (1, (1,)) without a ring,
    (1, (1/(R diag), 1/(R off), ...)) with one -- step 0 at the diagonal speed, the others off-diagonal.
    A window at least S_pad long changes nothing."""
    if sh.attention is not None:
        return sh.attention
    diag, off = block_speeds(sh)
    window = sh.window if 0 < sh.window < sh.S_pad and sh.windowed else 0
    full = documents.attention_pricing(sh.doc_lens, sh.S, sh.S_pad, 0, sh.R, diag, off, CAUSAL_HALF_TOKENS)
    if not window:
        sh.attention = (full.work, full.steps)
        return sh.attention
    local = documents.attention_pricing(sh.doc_lens, sh.S, sh.S_pad, window, sh.R, diag, off, CAUSAL_HALF_TOKENS)
    n_local, n_full = sh.windowed, sh.L - sh.windowed
    work = (n_full * full.work + n_local * local.work) / sh.L
    steps = tuple((n_full * f + n_local * w) / sh.L for f, w in zip(full.steps, local.steps))
    sh.attention = (work, steps)
    return sh.attention


def compute_factor(sh: Shapes) -> float:
    """Attention time / the same FLOPs at the whole-sequence causal speed. Ring: each of the R steps does
    1/R of the rank's (balanced) causal work, step 0 at the diagonal speed, the others at the off-diagonal
    one; packed documents and windows run shorter kernels (:func:`attention_steps`)."""
    if sh.R == 1 and not sh.doc_lens and not (0 < sh.window < sh.S_pad and sh.windowed):
        return 1.0
    work, steps = attention_steps(sh)
    return sum(steps) / work if work > 0 else 1.0


# --- traffic --------------------------------------------------------------------------------------------

def spans_nodes(hw: HardwareSpec, cand: Candidate) -> bool:
    """Whether the ring crosses nodes: its ranks are strided by U inside an SP group of consecutive ranks, so
    it does exactly when there is a ring and the SP group spans nodes."""
    return cand.ring > 1 and cand.sp > hw.devices_per_node


def link(hw: HardwareSpec, cand: Candidate) -> tuple[float, float]:
    """(effective bandwidth, latency) of one ring step: the slowest hop's."""
    if spans_nodes(hw, cand):
        return hw.inter_node_bandwidth * hw.comm_efficiency, hw.inter_node_latency
    return hw.intra_node_bandwidth * hw.comm_efficiency, hw.intra_node_latency


def kv_block_bytes(sh: Shapes) -> float:
    """One K/V block a rank sends per ring step: k and v of its S/R tokens for its KV heads, 2 s k' e bytes."""
    return 2.0 * sh.s * sh.k_eff * sh.e if sh.R > 1 else 0.0


def dkv_block_bytes(sh: Shapes) -> float:
    """One fp32 dK/dV accumulator a rank sends per backward ring step: 2 s k' x 4 bytes."""
    return 2.0 * sh.s * sh.k_eff * DKV_BYTES if sh.R > 1 else 0.0


def transfer_times(hw: HardwareSpec, cand: Candidate, sh: Shapes) -> tuple[float, float]:
    """(K/V block, dK/dV accumulator) seconds of one ring step, alpha + bytes / bandwidth."""
    if sh.R == 1:
        return 0.0, 0.0
    bandwidth, latency = link(hw, cand)
    latency *= sh.N  # sequence-chunked layers pass each block as N chunks (cost_models/chunks.py)

    def xfer(nbytes: float) -> float:
        return latency + (nbytes / bandwidth if bandwidth > 0 else float("inf"))

    return xfer(kv_block_bytes(sh)), xfer(dkv_block_bytes(sh))


def exposed_forward(t_kv: float, steps: list[float]) -> float:
    """Exposed P2P of one forward ring pass: the block for step i+1 travels under step i's attention
    (``steps[i]`` seconds); the first step computes the rank's own block, so nothing waits before it."""
    return sum(max(0.0, t_kv - steps[i]) for i in range(len(steps) - 1))


def exposed_backward(t_kv: float, t_dkv: float, steps: list[float]) -> float:
    """Exposed P2P of one backward ring pass over R = len(steps) steps.

    Step 0 hides the next K/V block; steps 1..R-2 hide the next K/V block and the previous step's dK/dV
    accumulator, which share the link; step R-1 hides only the previous dK/dV; the last dK/dV's hop home runs
    after the last step and is exposed entirely.
    """
    R = len(steps)
    if R <= 1:
        return 0.0
    exposed = max(0.0, t_kv - steps[0])
    exposed += sum(max(0.0, t_kv + t_dkv - steps[i]) for i in range(1, R - 1))
    exposed += max(0.0, t_dkv - steps[R - 1])
    return exposed + t_dkv


def layer_times(hw: HardwareSpec, cand: Candidate, sh: Shapes, t_att_fwd: float,
                bwd_factor: float) -> tuple[float, float, float, float]:
    """(forward P2P, forward exposed, backward P2P, backward exposed) seconds of one layer's ring passes for
    one micro-batch. ``t_att_fwd`` is the layer's ring attention forward time (already at block speed);
    the backward's steps take ``bwd_factor`` times as long."""
    R = sh.R
    if R == 1:
        return 0.0, 0.0, 0.0, 0.0
    t_kv, t_dkv = transfer_times(hw, cand, sh)
    _work, shares = attention_steps(sh)
    total = sum(shares)
    steps = [t_att_fwd * share / total for share in shares]
    back = [bwd_factor * t for t in steps]
    fwd_total = (R - 1) * t_kv
    bwd_total = (R - 1) * t_kv + R * t_dkv
    return fwd_total, exposed_forward(t_kv, steps), bwd_total, exposed_backward(t_kv, t_dkv, back)


# --- memory ----------------------------------------------------------------------------------------------

def forward_extra_bytes(sh: Shapes) -> float:
    """Bytes per local token the ring's forward holds on top of what Ulysses attention holds: the fp32
    output accumulator (q) and log-sum-exp (a), one step's partial output (e bytes) and log-sum-exp (fp32),
    and RING_KV_BUFFERS K/V blocks. (Per local token: a rank holds S/R tokens x H/U heads = s x H.)"""
    if sh.R == 1:
        return 0.0
    return 4.0 * sh.q + 4.0 * sh.a + sh.e * sh.q + 4.0 * sh.a + RING_KV_BUFFERS * 2.0 * sh.k_eff * sh.e


def backward_extra_bytes(sh: Shapes) -> float:
    """Bytes per local token the ring's backward holds on top of what Ulysses attention's backward holds:
    the fp32 dQ accumulator across steps (q x 4), RING_DKV_BUFFERS fp32 dK/dV accumulators (2k' x 4 each)
    and RING_KV_BUFFERS K/V blocks (2k' x e each)."""
    if sh.R == 1:
        return 0.0
    return (4.0 * sh.q + RING_DKV_BUFFERS * 2.0 * sh.k_eff * DKV_BYTES
            + RING_KV_BUFFERS * 2.0 * sh.k_eff * sh.e)


def sequence_policy_without_all_to_all(sh: Shapes) -> tuple[float, float]:
    """(kept elements fewer, attention-phase backward elements more) per local token and layer under ``sequence``
    checkpointing in a pure ring (U = 1), against what the profile's ``sequence`` set describes.

    ``sequence`` saves attention outputs and *collective* outputs (compiler/passes/checkpointing.py): under
    Ulysses that is q, k, v after their all-to-all and the attention output in both layouts (before and after
    the return all-to-all). A pure ring has no all-to-all: q, k, v come straight from the projections and are
    recomputed in the backward like them, and the attention output has one layout. Measured
    (studies/ring_costs.py, sp 4, S 4096): a ring of 4 saved 3.2 MiB per rank under ``sequence``, U 2 x R 2
    6.1 MiB, where the profile's set predicts 6.0 MiB for both. The recomputed q, k, v then live through the
    layer's attention backward, like under ``full``."""
    if sh.R == 1 or sh.U > 1:
        return 0.0, 0.0
    qkv = sh.q + 2.0 * sh.k_eff
    return qkv + sh.q, qkv


def pointwise_bytes(sh: Shapes) -> tuple[float, float]:
    """(forward, backward) HBM traffic per local token and layer of the ring's merges and copies.

    Forward, per step: read and write the fp32 output accumulator (8q), read the step's output (e q), read
    and write the fp32 log-sum-exp and read the step's (12a); per transfer: copy the K/V block into the send
    buffer (read + write 2k' e). Backward, per step: the fp32 dQ accumulator (8q + e q) and the fp32 dK/dV
    accumulator (read, add the step's e-byte partial, write: 16k' + 2k' e); per transfer the K/V copy."""
    R = sh.R
    if R == 1:
        return 0.0, 0.0
    q, k, e, a = sh.q, sh.k_eff, sh.e, sh.a
    copies = (R - 1) * 2.0 * 2 * k * e
    forward = R * (8.0 * q + e * q + 12.0 * a) + copies
    backward = R * (8.0 * q + e * q + 16.0 * k + 2.0 * k * e) + copies
    return forward, backward
