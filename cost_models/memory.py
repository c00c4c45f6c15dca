"""Per-GPU peak memory of one training step, by component (docs/cost_model.md derives every term).

All functions are pure and cheap (plain floats). Sizes are bytes.
"""

from __future__ import annotations

import math

from autosp.contract import deepspeed_buffers as ds
from autosp.cost_models import chunks, linear_attention, moe, param_offload, profile, ring
from autosp.cost_models.profile import POLICY_INDEX
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, HardwareSpec, MemoryBreakdown, ModelSpec

GIB = 1024 ** 3

# --- allocator / runtime reserve -------------------------------------------------------------------
CUDA_CONTEXT_BYTES = 1.0 * GIB
"""CUDA context, cuBLAS/cuDNN workspaces and kernel images: ~0.5-1 GiB per process on Hopper."""

NCCL_BYTES = 0.5 * GIB
"""NCCL communicator buffers (SP, DP and world groups) when world > 1."""

FRAGMENTATION = 0.05
"""Caching-allocator fragmentation, as a fraction of the dynamically allocated bytes (activations,
logits, communication buffers, gathered ZeRO-3 parameters). Model states are allocated once."""

HOST_USABLE_FRACTION = 0.8
"""Share of a node's host DRAM that pinned activation-offload buffers may use (the rest: OS, data
loader, DeepSpeed's own pinned buffers)."""

# --- logits + loss ---------------------------------------------------------------------------------
LOSS_FP32_BYTES = profile.LOSS_FP32_BYTES
"""Per logit, the fp32 tensors alive at the loss peak besides the logits themselves (analytic profile)."""
FUSED_LOSS_FP32_BYTES = profile.FUSED_LOSS_FP32_BYTES
"""The same for an untiled loss Inductor compiled into one kernel."""


# ---------------------------------------------------------------------------------------------------
# Model states
# ---------------------------------------------------------------------------------------------------

def state_bytes_per_param(dtype: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes per parameter before ZeRO partitioning.

    bf16 mixed precision (ZeRO paper, arXiv 1910.02054, section 3.1): 2 + 2 + 12 (fp32 master
    weights, Adam momentum and variance). fp32 training: 4 + 4 + 8 (Adam m and v; the weights are
    already fp32, so no master copy). Both total 16 bytes per parameter.
    """
    return (2, 2, 12) if dtype == "bf16" else (4, 4, 8)


def zero_state_bytes(psi: float, nd: int, stage: int, dtype: str = "bf16") -> tuple[float, float, float]:
    """(parameters, gradients, optimizer states) bytes per GPU for psi parameters whose states are
    shared by nd ranks at ZeRO ``stage`` (ZeRO paper, arXiv 1910.02054, Figure 1 / section 5):
    0: 16psi; 1: 4psi + 12psi/nd; 2: 2psi + 14psi/nd; 3: 16psi/nd (bf16; fp32 splits 4 + 4 + 8)."""
    w, g, o = state_bytes_per_param(dtype)
    params = psi * w / nd if stage >= 3 else psi * w
    grads = psi * g / nd if stage >= 2 else psi * g
    optim = psi * o / nd if stage >= 1 else psi * o
    return params, grads, optim


def zero3_gathered_params(sh: Shapes, lm_head_persistent: bool = False) -> float:
    """Parameter elements ZeRO-3 holds gathered at its peak: the largest module in use (a decoder
    layer, or the embedding / LM-head matrix) plus one prefetch bucket, capped by
    stage3_max_live_parameters (never below the module in use), plus the persistent small parameters
    (norm weights and biases under stage3_param_persistence_threshold, always gathered), plus the LM
    head's matrix when the loss is tiled (the compiler keeps it gathered so that it is traced inline
    with the loss: compiler/zero3.py). With the head resident, the largest module gathered on demand while
    activations are held is a decoder layer: the head's matrix is counted once, as persistent, and the input
    embedding (the same matrix when tied, which the compiler then holds once:
    tests/compiler/test_compiler_knobs_tiling.py) is gathered only by the forward's first op and the backward's
    last, when no activation is held."""
    layer = sh.layer_params if sh.moe is None else moe.gathered_layer_params(sh.moe, sh.layer_params)
    largest = layer if lm_head_persistent else max(layer, sh.lm_head_params)
    gathered = min(largest + min(ds.STAGE3_PREFETCH_BUCKET_SIZE, layer), max(ds.STAGE3_MAX_LIVE_PARAMETERS, largest))
    persistent = sh.L * sh.prof.layer_small_params + sh.prof.other_small_params
    if lm_head_persistent:
        persistent += sh.head_matmul_params
    return gathered + persistent


def model_states(cand: Candidate, dtype: str, sh: Shapes) -> tuple[float, float, float, float]:
    """(parameters, gradients, optimizer_states, gathered) bytes on one GPU of everything but the routed experts
    of a mixture of experts (:func:`expert_state_bytes`).

    ZeRO partitions over N_d = dp x sp ranks (parameters are replicated across the SP group, so the
    SP ranks share the states too). At stage 3 ``parameters`` includes ``gathered``: the bytes of
    parameters all-gathered at the peak (:func:`zero3_gathered_params`).
    """
    nd = cand.sp * cand.dp
    experts = sh.moe.expert_params if sh.moe else 0  # routed experts: expert_state_bytes
    params, grads, optim = zero_state_bytes(sh.n_params - experts, nd, cand.zero_stage, dtype)
    if cand.offload_optimizer:
        # ZeRO-Offload (arXiv 2101.06840): master weights and Adam states live on the host; from stage
        # 2 on, reduced gradient partitions are copied to the host bucket by bucket (the buckets are
        # counted with the communication buffers), so only stage 1 keeps full gradients on the device.
        optim = 0.0
        if cand.zero_stage >= 2:
            grads = 0.0
    gathered = 0.0
    offloaded = param_offload.enabled(cand)
    if cand.zero_stage >= 3 and (nd > 1 or offloaded):
        gathered = state_bytes_per_param(dtype)[0] * zero3_gathered_params(sh, cand.loss_chunks > 1)
        # parameter offload (cost_models/param_offload.py): the partition lives on the host, only the
        # parameters in flight are on the device
        params = gathered if offloaded else params + gathered
    return params, grads, optim, gathered


def expert_state_bytes(cand: Candidate, dtype: str, sh: Shapes) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) of the routed experts on one GPU: sharded by ``ep``, then by ZeRO
    over the sp x dp / ep ranks holding the same experts (cost_models/moe.py); zeros for a dense model."""
    if sh.moe is None:
        return 0.0, 0.0, 0.0
    return moe.expert_state_bytes(sh.moe, cand.zero_stage, dtype, cand.offload_optimizer, param_offload.enabled(cand))


# ---------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------

def layer_saved_elems(sh: Shapes, policy: str, mlp_tiled: bool) -> tuple[float, float]:
    """(attention-side, MLP-side) elements per local token one decoder layer keeps for its backward,
    from the profile (``kept_attn`` / ``kept_mlp``; K/V elements times Ulysses' KV replication).

    Analytic profile (Llama block, SDPA/flash attention, Ulysses; docs/cost_model.md, "Activations"):

    none:      x, norm1(x) | q, k, v after the all-to-all, attention output (head-sharded, kept by
               SDPA) and its sequence-sharded copy (o_proj input) | h1 = x + attn, norm2(h1)
               | gate, silu(gate), up, silu*up
    selective: x | q, k, v, O, O' | o_proj output      | gate, up
    sequence:  x | q, k, v, O, O'
    full:      x
    With MLP tiling the MLP keeps only its input (norm2 output, already counted under ``none``;
    recomputed from kept tensors under ``selective``).
    """
    i = POLICY_INDEX[policy]
    c = sh.kv_copies
    attn = sh.prof.kept_attn[i]
    attn_elems = attn.other + attn.kv * c
    if policy == "sequence":  # a pure ring has no all-to-all outputs to save (ring.py)
        attn_elems -= ring.sequence_policy_without_all_to_all(sh)[0]
    if mlp_tiled:
        return attn_elems, 0.0
    mlp = sh.prof.kept_mlp[i]
    return attn_elems, mlp.other + mlp.kv * c


def layer_extra_bytes(sh: Shapes, policy: str, mlp_tiled: bool = False) -> float:
    """Dtype-independent bytes per token kept per layer (``fixed`` of the kept sets). Analytic: fp32
    attention logsumexp (one per head, i.e. n_heads per local token after the all-to-all), RMSNorm
    inverse RMS (two per token, only if norms are not recomputed)."""
    i = POLICY_INDEX[policy]
    extra = sh.prof.kept_attn[i].fixed
    if not mlp_tiled:
        extra += sh.prof.kept_mlp[i].fixed
    return extra


def layer_kept_bytes(sh: Shapes, policy: str, mlp_tiled: bool) -> float:
    """Bytes one decoder layer keeps for its backward on one GPU (:func:`layer_saved_elems` and
    :func:`layer_extra_bytes` over the local tokens), averaged over the layers of a hybrid model: its linear-attention
    layers keep their own attention side (:func:`linear_attention.kept_bytes`, the fp32 states included) beside the
    same MLP side, so the layer count times this is the layers' total."""
    attn, mlp = layer_saved_elems(sh, policy, mlp_tiled)
    per_layer = sh.s * ((attn + mlp) * sh.e + layer_extra_bytes(sh, policy, mlp_tiled))
    if sh.lin is None:
        return per_layer
    attention_side = sh.s * (attn * sh.e + sh.prof.kept_attn[POLICY_INDEX[policy]].fixed)
    return per_layer + sh.lin.share * (linear_attention.kept_bytes(sh.lin, policy) - attention_side)


def layer_transient_bytes(sh: Shapes, policy: str, mlp_chunks: int, experts: float = 0.0) -> float:
    """Bytes one layer's backward holds on top of the kept sets: the larger of its MLP phase (:func:`mlp_phase_bytes`,
    ``experts``: the experts op's fixed bytes per token) and its attention phase (:func:`layer_attention_phase`); of a
    hybrid model, of its softmax- and its linear-attention layers' (the linear one's MLP phase with its own recomputed
    tensors, its op's backward: :func:`linear_attention.mixer_phase_bytes`)."""
    attn_phase, attn_fixed = layer_attention_phase(sh, policy)
    mlp = mlp_phase_bytes(sh, policy, mlp_chunks, experts)
    attention = sh.s * sh.e * attn_phase + sh.s * attn_fixed
    if sh.lin is None:
        return max(mlp, attention)
    re = sh.prof.recompute_mlp_phase[POLICY_INDEX[policy]]
    lin_re, lin_re_fixed = linear_attention.recompute_mlp_phase(sh.lin, policy)
    lin_mlp = mlp + sh.s * (sh.e * (lin_re - re.other - re.kv * sh.kv_copies) + lin_re_fixed - re.fixed)
    if policy == "full":  # the recomputed layer's op saved its states again
        lin_mlp += linear_attention.state_bytes(sh.lin)
    lin = max(lin_mlp, linear_attention.mixer_phase_bytes(sh.lin, policy))
    return max(lin, mlp, attention) if sh.La else lin


def layer_transient_phases(sh: Shapes, policy: str, mlp_chunks: int) -> tuple[float, float, float, float]:
    """(MLP-phase elements, MLP-phase fixed bytes, attention-phase elements, attention-phase fixed bytes)
    per local token alive on top of the kept set while one layer runs its backward.

    Two phases, the larger one is the peak (docs/cost_model.md, "Backward working set"):

    - MLP backward: the attention-side tensors the policy recomputed (analytic selective/sequence:
      norm1 output, h1 and norm2 output; full: all of them), the MLP intermediates that are not kept
      (all four, or one chunk's 4f/N when tiled), and the MLP gradients (3f/N) with the residual-stream
      gradient in and out (2h).
    - attention backward: h1, norm2 output and the o_proj input are freed by then; the recomputed
      norm1 output / q, k, v / attention output remain, plus dO, dq, dk, dv, flash attention's fp32 dq
      accumulator (2q in 2-byte units) and the residual gradient (h). With a ring, its backward buffers
      (fp32 dQ and dK/dV accumulators, K/V blocks in flight: :func:`ring.backward_extra_bytes`) join this
      phase as fixed bytes. The ring's forward (:func:`ring.forward_extra_bytes`, in the forward or a full
      recompute) holds only n1, q, k, v and the residual gradient besides its buffers, well below this
      phase, so it never sets the peak (tested for every preset).
    """
    return (*layer_mlp_phase(sh, policy, mlp_chunks), *layer_attention_phase(sh, policy))


def layer_mlp_phase(sh: Shapes, policy: str, mlp_chunks: int) -> tuple[float, float]:
    """(elements, fixed bytes) per local token of the MLP backward phase (:func:`layer_transient_phases`)."""
    p = sh.prof
    i = POLICY_INDEX[policy]
    re_mlp = p.recompute_mlp_phase[i]
    mlp_live, live_fixed = profile.mlp_live_per_token(p, i, mlp_chunks)
    mlp_phase = (re_mlp.other + re_mlp.kv * sh.kv_copies) + mlp_live + p.mlp_grads.other / mlp_chunks \
        + p.mlp_phase_grads.other
    mlp_fixed = re_mlp.fixed + live_fixed + p.mlp_grads.fixed / mlp_chunks + p.mlp_phase_grads.fixed
    return mlp_phase, mlp_fixed


def tiled_weight_grad_bytes(sh: Shapes, params: float) -> float:
    """Bytes of the weight gradients a tiled op (tiled MLP, tiled logits + loss) holds through its whole backward:
    it recomputes and back-propagates N chunks, each chunk's GEMM adding into gradients in the weight dtype (e
    bytes per parameter), which it returns. The untiled op's gradients are matmul outputs made at the end of its
    backward, after its peak, so at the tiled op's peak these bytes are extra."""
    return sh.e * params


def mlp_phase_bytes(sh: Shapes, policy: str, mlp_chunks: int, extra_fixed: float = 0.0) -> float:
    """Bytes alive on top of the kept set during one layer's MLP backward: :func:`layer_mlp_phase` over the
    local tokens (``extra_fixed``: more fixed bytes per token, the experts' buffers) and, when a dense MLP is
    tiled, the weight gradients its chunks add into (:func:`tiled_weight_grad_bytes`). A mixture of experts'
    MoE layer: the larger of that working set (beside the expert-gradient sums of earlier token pieces) and what
    the experts op holds when its backward ends, its expert weight gradients and the tokens' input gradient
    (:func:`moe.expert_grad_bytes`)."""
    mlp_phase, mlp_fixed = layer_mlp_phase(sh, policy, mlp_chunks)
    working = sh.s * sh.e * mlp_phase + sh.s * (mlp_fixed + extra_fixed)
    if sh.moe is not None:
        during, at_end = moe.expert_grad_bytes(sh.moe, sh.e, mlp_chunks)
        return max(working + during, at_end + sh.s * sh.h * sh.e)
    if mlp_chunks == 1:
        return working
    return working + tiled_weight_grad_bytes(sh, sh.mlp_params)


def layer_attention_phase(sh: Shapes, policy: str) -> tuple[float, float]:
    """(elements, fixed bytes) per local token of the attention backward phase (:func:`layer_transient_phases`):
    no MLP tiling changes it."""
    p = sh.prof
    c = sh.kv_copies
    re_attn, grads = p.recompute_attn_phase[POLICY_INDEX[policy]], p.attn_grads
    attn_phase = (re_attn.other + re_attn.kv * c) + grads.other + grads.kv * c
    if policy == "sequence":  # a pure ring recomputes q, k, v under `sequence` (ring.py)
        attn_phase += ring.sequence_policy_without_all_to_all(sh)[1]
    attn_fixed = re_attn.fixed + grads.fixed + ring.backward_extra_bytes(sh)
    return attn_phase, attn_fixed


def layer_transient_elems(sh: Shapes, policy: str, mlp_chunks: int) -> float:
    """The larger phase of :func:`layer_transient_phases`, in elements (fixed bytes, ring buffers included,
    left out)."""
    mlp_phase, _, attn_phase, _ = layer_transient_phases(sh, policy, mlp_chunks)
    return max(mlp_phase, attn_phase)


def activation_bytes(sh: Shapes, cand: Candidate) -> tuple[float, float, float, float]:
    """(kept on device, one-layer transient, per-layer kept, host bytes) for one GPU.

    ``kept on device`` holds every layer's saved set (or, with activation offload, two layers'
    worth: the one being copied and the one in use; with offload_chunks two chunks of one layer's)
    plus what is kept outside the layers (analytic: the final norm's input and output). ``host bytes``
    is what offload parks in host memory (all layers' saved sets; with offload_chunks also the fp32
    dK/dV accumulators of the layer in its backward: :func:`chunks.host_bytes`). Sequence-chunked
    layers (``sequence_chunks`` > 1) are kept like attention (their own set, :func:`chunks.saved_bytes_per_token`)
    unless the policy is ``full``: then each keeps its input (the checkpoint, which activation offload moves)
    and, in its backward, re-runs its chunked forward, which keeps its set again for that one layer (on the
    host with offload_chunks). Either way one chunk's backward working set: :func:`chunks.transient_bytes`.
    """
    s, e = sh.s, sh.e
    tiled = cand.mlp_chunks > 1
    chunked = sh.N > 1
    recomputed = chunked and cand.checkpointing == "full"   # the chunked layer itself is recomputed
    if chunked and not recomputed:  # kept like attention: the chunked layer's own set (cost_models/chunks.py)
        per_layer = s * chunks.saved_bytes_per_token(sh)
    else:
        per_layer = layer_kept_bytes(sh, cand.checkpointing, tiled)
    if not recomputed:  # router, permutation buffers, the busiest EP rank's margin (cost_models/moe.py)
        per_layer += s * moe.kept_bytes_per_token(sh.moe, e, "none" if chunked else cand.checkpointing)
    final_norm = outside_layers_bytes(sh)
    if cand.offload_chunks and not recomputed:  # the kept chunks live on the host
        kept = chunks.kept_on_device(per_layer, sh.L, sh.N, True) + final_norm
        host = chunks.host_bytes(sh, per_layer)
    elif cand.offload_activations:
        kept = min(2, sh.L) * per_layer + final_norm
        host = sh.L * per_layer
    else:
        kept = sh.L * per_layer + final_norm
        host = 0.0
    if chunked:
        transient = chunks.transient_bytes(sh, cand.mlp_chunks, cand.offload_chunks)
        if recomputed:  # the layer in its backward re-runs the chunked forward, which keeps its set again
            layer_set = s * chunks.saved_bytes_per_token(sh)
            if cand.offload_chunks:
                transient += chunks.kept_on_device(layer_set, 1, sh.N, True)
                host += chunks.host_bytes(sh, layer_set) - (sh.L - 1) * layer_set
            else:
                transient += layer_set
    else:
        experts = moe.transient_bytes_per_token(sh.moe, e, cand.checkpointing)
        transient = layer_transient_bytes(sh, cand.checkpointing, cand.mlp_chunks, experts)
    return kept, transient, per_layer, host


def outside_layers_bytes(sh: Shapes) -> float:
    """Bytes of what is kept outside the layers (the profile's ``final``; analytic: the final norm's input and
    output, 2h per token). They are alive from the forward through the loss phase and are freed by the final
    norm's backward, which runs before any layer's: the layers' backward never holds them (an eager trace of
    transformers' Qwen3 frees the final norm's saved tensors and the LM head's input before the last layer's
    first backward op; a compiled backward frees its inputs at their last use). A graph profile also counts here
    the rotary cos/sin tables the layers read (2 x head_dim elements per token, under 0.2% of a Qwen3-8B layer's
    backward peak), which the layers' backward does hold: left out of that phase."""
    final = sh.prof.final
    return (final.other + final.kv * sh.kv_copies) * sh.e * sh.s + final.fixed * sh.s


def loss_phase_bytes(sh: Shapes, cand: Candidate) -> tuple[float, float]:
    """(loss peak, logits kept through the layers' backward) in bytes.

    Untiled: the profile's loss peak per token (analytic: bf16 logits, e bytes, kept alive by the
    model output through the backward, plus LOSS_FP32_BYTES of fp32 tensors at the loss peak:
    V x (e + 12)); the logits (``prof.logits``) then stay alive through the layers' backward.
    Untiled under Inductor (``Workload.compile_backend``): the fused cross-entropy holds FUSED_LOSS_FP32_BYTES
    per logit instead of LOSS_FP32_BYTES: V x (e + 4).
    Tiled over N chunks (recomputed in backward, ALST's TiledFusedLogitsLoss): one chunk's worth of
    the same tensors plus the gradient of the hidden states (s x h) and the head's weight gradient the tiles
    add into (V x h: :func:`tiled_weight_grad_bytes`), no logits kept. The tiles run op by op
    under every backend (the tiled loss is one custom op that Inductor does not look into).
    """
    s, e = sh.s, sh.e
    p = sh.prof
    peak_token = p.loss_peak.other * e + p.loss_peak.fixed
    n = cand.loss_chunks
    if n == 1 and sh.fused_loss:
        peak_token = p.loss_peak.other * e + FUSED_LOSS_FP32_BYTES * sh.V
    if n > 1:
        chunk = math.ceil(s / n)
        return (chunk * peak_token + tiled_weight_grad_bytes(sh, sh.V * sh.h)
                + s * (p.loss_hidden_grad.other * e + p.loss_hidden_grad.fixed)), 0.0
    return s * peak_token, s * (p.logits.other * e + p.logits.fixed)


def a2a_buffer_bytes(sh: Shapes) -> float:
    """All-to-all staging: send + receive copies of the largest q/k/v/out tensor of one chunk (the whole
    local sequence unless sequence-chunked; 0 without a Ulysses dimension: no SP, or a pure ring); of a hybrid model
    the larger of that and a linear layer's (:func:`linear_attention.a2a_buffer_bytes`)."""
    attention = 2.0 * sh.c * max(sh.q, sh.k_eff) * sh.e if sh.U > 1 else 0.0
    return attention if sh.lin is None else max(attention, linear_attention.a2a_buffer_bytes(sh.lin))


def comm_buffer_bytes(sh: Shapes, cand: Candidate) -> float:
    """All-to-all staging (send + receive of the largest q/k/v/out tensor; with expert parallelism also the
    dispatch's send and receive buffers, cost_models/moe.py) and ZeRO buckets.

    ZeRO buckets (elements in deepspeed_buffers, gradients in the training dtype): stage 0 one
    reduce bucket; stages 1-2 two gradient staging buffers of a reduce bucket each with overlap_comm
    (deepspeed_buffers.STAGING_BUFFERS; measured by studies/knob_costs.py); stage 3 a double-buffered
    reduce bucket (the prefetch bucket is counted with the gathered parameters).
    """
    e = sh.e
    a2a = a2a_buffer_bytes(sh) + moe.a2a_buffer_bytes(sh.moe, sh.s, e)
    stage = cand.zero_stage
    bucket = ds.reduce_bucket_elements(sh.n_params)
    if stage == 0:
        zero = bucket * e
    elif stage in (1, 2):
        zero = ds.STAGING_BUFFERS * bucket * e
    else:
        zero = (2.0 if ds.OVERLAP_COMM else 1.0) * bucket * e
    return a2a + zero


def reserve_bytes(dynamic: float, world: int) -> float:
    """CUDA context + NCCL buffers (fixed) + allocator fragmentation (a share of dynamic bytes)."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if world > 1 else 0.0) + FRAGMENTATION * dynamic


def optimizer_host_bytes(cand: Candidate, sh: Shapes) -> float:
    """Host bytes per GPU under ZeRO-Offload: fp32 master weights, Adam m and v (12) and the fp32
    gradient partition (4) for this rank's 1/N_d share of the parameters."""
    if not cand.offload_optimizer:
        return 0.0
    return 16.0 * sh.n_params / (cand.sp * cand.dp)


def host_bytes_available(hw: HardwareSpec) -> float:
    """Host DRAM one GPU may fill with offloaded activations."""
    return hw.host_memory_bytes / hw.devices_per_node * HOST_USABLE_FRACTION


def capacity_bytes(hw: HardwareSpec) -> float:
    return hw.accelerator.memory_bytes * hw.usable_memory_fraction


def memory_breakdown(model: ModelSpec, hw: HardwareSpec, dtype: str, cand: Candidate,
                     sh: Shapes) -> tuple[MemoryBreakdown, tuple, tuple[str, ...]]:
    """(MemoryBreakdown, (kept, transient, per_layer, host), notes).

    If activation offload needs more host memory than the node has, the candidate is infeasible:
    its activations are reported as infinite and a note says how much host memory it needs.
    """
    notes: tuple[str, ...] = ()
    params, grads, optim, gathered = model_states(cand, dtype, sh)
    expert_w, expert_g, expert_o = expert_state_bytes(cand, dtype, sh)
    kept, transient, per_layer, host = activation_bytes(sh, cand)
    activations = kept - outside_layers_bytes(sh) + transient  # the layers' backward: outside_layers_bytes
    host_total = host + optimizer_host_bytes(cand, sh) + param_offload.host_bytes(sh, cand)
    if host_total > 0:
        available = host_bytes_available(hw)
        if host_total > available:
            activations = math.inf
            notes += (f"offload needs {host_total / GIB:.1f} GiB of host memory per GPU, "
                      f"the node offers {available / GIB:.1f} GiB per GPU",)
    buffers = comm_buffer_bytes(sh, cand)
    # Two moments can be the peak. In the loss phase (the LM head and cross-entropy, forward and the
    # start of their backward) the layers' working set is gone and no gradient exists yet: DeepSpeed
    # allocates its gradient buffers at the first gradient hook (process_gradients -> setup_buckets),
    # after the loss backward, and the previous step's gradients were freed by zero_grad. In the
    # layers' backward the gradients, ZeRO buffers, one layer's transient and the untiled logits join
    # the layers' kept sets (what is kept outside the layers is gone by then: outside_layers_bytes). The
    # breakdown is the composition at whichever is larger
    # (studies/cost_model_accuracy.py measured the loss phase as the peak of the untiled CPU runs).
    loss_peak, logits = loss_phase_bytes(sh, cand)
    a2a = a2a_buffer_bytes(sh)
    loss_phase = kept + loss_peak + a2a
    backward_phase = grads + expert_g + buffers + activations + logits
    if math.isfinite(activations) and loss_phase > backward_phase:
        grads, expert_g, activations, logits, buffers = 0.0, 0.0, kept, loss_peak, a2a
        notes += ("peak in the loss phase (LM head + cross-entropy): gradients and ZeRO buffers are not "
                  "allocated yet",)
    dynamic = activations + logits + buffers + gathered
    reserve = reserve_bytes(dynamic, cand.sp * cand.dp)
    return (MemoryBreakdown(parameters=params, gradients=grads, optimizer_states=optim, activations=activations,
                            logits_loss=logits, comm_buffers=buffers, reserve=reserve,
                            expert_states=expert_w + expert_g + expert_o),
            (kept, transient, per_layer, host), notes)


__all__ = ["CUDA_CONTEXT_BYTES", "FRAGMENTATION", "GIB", "HOST_USABLE_FRACTION", "LOSS_FP32_BYTES", "NCCL_BYTES",
           "a2a_buffer_bytes", "activation_bytes", "capacity_bytes", "comm_buffer_bytes", "expert_state_bytes", "host_bytes_available",
           "layer_extra_bytes", "layer_kept_bytes", "layer_saved_elems", "layer_transient_bytes", "layer_attention_phase", "layer_mlp_phase", "layer_transient_elems",
           "layer_transient_phases", "mlp_phase_bytes", "tiled_weight_grad_bytes",
           "loss_phase_bytes", "memory_breakdown", "model_states", "optimizer_host_bytes", "outside_layers_bytes",
           "reserve_bytes",
           "state_bytes_per_param", "zero3_gathered_params", "zero_state_bytes"]
