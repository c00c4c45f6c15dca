"""Mixture-of-experts costs: parameters (total and active), expert parallelism, dispatch/combine all-to-alls.

Pure functions of plain numbers (no torch): memory.py, flops.py, step_time.py and the analytic profile call them
through small hooks, and they return 0 (or the dense answer) for a dense model. docs/cost_model.md, "Mixture of
experts", derives every term.

The model (ModelSpec fields ``n_experts`` E, ``experts_per_token`` k, ``expert_ffn_hidden`` f_e,
``shared_ffn_hidden`` f_s, ``dense_layers``): every MoE layer has a router (h x E, no bias: Mixtral, Qwen3-MoE,
OLMoE and DeepSeek-V2 alike), E routed experts of m x h x f_e weights (m = 3 gated, 2 not) and, with f_s > 0,
shared experts of m x h x f_s every token uses. A token runs through its k routed experts: the active MLP is
router + shared + k experts. gpt-oss (``expert_bias``) adds a bias to the router (E) and to each expert's two
projections ((m - 1) f_e + h): parameters, states and gradients like the weights (their FLOPs are negligible);
its clamped SwiGLU (``clamped_swiglu``) rebuilds more f_e-wide tensors in the op's backward
(:data:`CLAMPED_SWIGLU_EXTRA_PER_WIDTH`).

Expert parallelism (``Candidate.ep``): the ep consecutive ranks of an EP group (SP and DP ranks alike: all hold
distinct tokens) hold E / ep experts each. Every MoE layer sends each local token's k copies to the ranks of its
experts (dispatch) and the expert outputs back (combine): 2 all-to-alls in the forward, 2 in the backward (their
gradients), 2 more for the forward the experts op re-runs in its backward, 2 more when the policy recomputes the
MLP. Expert states are sharded by ep first, then by ZeRO over the sp x dp / ep ranks that hold the same experts
(the expert-data-parallel group); the rest of the model is sharded by ZeRO over all sp x dp ranks as for a dense
model.

What the compiler runs (compiler/experts.py): the routed experts are one custom op that saves only its inputs
and re-runs its forward under autograd in its backward, whatever the checkpointing policy. So its backward
recomputes the routed experts' forward (:func:`recomputed_expert_flops`) and its exchanges, rebuilds their inner
tensors (:func:`op_transient`) and ends holding the layer's local expert weight gradients beside autograd's
stacking of them (:func:`expert_grad_bytes`).

Load imbalance: Hugging Face's MoE blocks drop no token, so the most loaded rank of an EP group receives more
than the mean s x k token copies. :data:`CAPACITY_FACTOR` is the margin priced for it (on that rank's expert
compute, expert-side activations and all-to-all bytes); with ep = 1 every rank runs all its own copies and
there is no imbalance between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from autosp.contract.specs import expert_params_each

__all__ = ["CAPACITY_FACTOR", "CLAMPED_SWIGLU_EXTRA_PER_WIDTH", "EXPERT_LIVE_PER_WIDTH", "INDEX_BYTES", "MoeShape", "OP_PERMUTATION_COPIES",
           "ROUTER_FIXED_BYTES_PER_EXPERT", "a2a_buffer_bytes", "active_params", "all_to_alls_per_layer",
           "dispatch_buffer_bytes", "dispatch_bytes", "expert_grad_bytes", "expert_params", "expert_state_bytes",
           "gathered_layer_params", "imbalance_flops_forward", "kept_bytes_per_token", "layout", "mean_active_ffn",
           "mean_routed_ffn", "mean_router_params", "moe_layer_kept", "op_transient", "optimizer_params",
           "recomputed_expert_flops", "router_kept", "transient_bytes_per_token"]

CAPACITY_FACTOR = 1.25
"""Tokens the most loaded rank of an EP group receives, relative to the mean (s x k copies per rank). Switch
Transformer (arXiv 2101.03961, section 2.2 and Table 1) trains with capacity factors 1.0-1.25 and shows that a
load-balancing loss keeps the busiest expert within them; 1.25 is its training setting. A dropless block has no
capacity to enforce, so the margin is what the busiest rank pays in compute, memory and all-to-all bytes."""

ROUTER_FIXED_BYTES_PER_EXPERT = 4
"""The router's fp32 softmax probabilities (softmax in fp32, kept for its backward): 4 B per token and expert."""

INDEX_BYTES = 8
"""The top-k expert indices (int64) kept per token copy."""

OP_PERMUTATION_COPIES = 5
"""h-wide tensors per routed token copy the compiler's experts op holds at its backward's peak: the gathered rows,
the experts' outputs (their concatenation and its reordering), the weighted output, and the gradients of those
being back-propagated. A least-squares fit of the op's allocated backward peak over five shapes gives 5.08 at
4,096 tokens (``python -m studies.moe_costs``, "experts op backward"); 5 whole tensors are priced.
(Hugging Face's eager blocks keep 3 from their forward instead: gathered input, expert output, weighted output.)"""


def _m(model) -> int:
    return 3 if model.gated_mlp else 2


def expert_params(model) -> int:
    """Parameters of all routed experts of the model, their biases included (what expert parallelism shards)."""
    return model.moe_layers * model.n_experts * expert_params_each(model)


def active_params(model) -> int:
    """Parameters one token uses: every parameter but the n_experts - k routed experts it skips per MoE layer
    (the model's own count, ModelSpec.n_params)."""
    return model.n_params(active=True)


def mean_active_ffn(model) -> float:
    """The MLP width a token runs through, averaged over the layers: k x f_e + f_s in MoE layers, ffn_hidden in
    dense ones. The activation and matmul formulas of a dense MLP of this width price the active experts."""
    if not model.n_experts:
        return float(model.ffn_hidden)
    moe = model.experts_per_token * model.expert_ffn_hidden + model.shared_ffn_hidden
    return (model.moe_layers * moe + (model.n_layers - model.moe_layers) * model.ffn_hidden) / model.n_layers


def mean_routed_ffn(model) -> float:
    """The part of :func:`mean_active_ffn` that the routed experts make up, k x f_e in MoE layers averaged over
    all layers: the width the compiler's experts op runs (it keeps none of it for the backward)."""
    if not model.n_experts:
        return 0.0
    return model.moe_layers * model.experts_per_token * model.expert_ffn_hidden / model.n_layers


def mean_router_params(model) -> float:
    """Router weights per layer, averaged over the layers (its matmul runs on every token)."""
    return model.moe_layers * model.hidden * model.n_experts / model.n_layers if model.n_experts else 0.0


@dataclass(frozen=True)
class MoeShape:
    """The numbers the MoE costs need for one (model, candidate): experts, widths, EP degree and margin."""

    E: int
    k: int
    h: int
    fe: int
    m: int
    moe_layers: int
    L: int
    ep: int
    world: int
    expert_params: int
    extra_live: float = 0.0
    """f_e-wide tensors per token copy the experts' gate rebuilds in the op's backward beyond SiLU's
    (:data:`CLAMPED_SWIGLU_EXTRA_PER_WIDTH` for gpt-oss, 0 otherwise)."""

    @property
    def cf(self) -> float:
        """The load-imbalance margin of the busiest rank (1 without expert parallelism)."""
        return CAPACITY_FACTOR if self.ep > 1 else 1.0

    @property
    def expert_layer_params(self) -> int:
        """Routed-expert parameters of one MoE layer (their biases included)."""
        return self.expert_params // self.moe_layers


def layout(model, cand) -> MoeShape | None:
    """The MoE shape of ``model`` under ``cand`` (None for a dense model); ValueError when ``cand.ep`` cannot
    split the experts."""
    ep = getattr(cand, "ep", 1)
    if not model.n_experts:
        if ep > 1:
            raise ValueError(f"ep={ep} needs a mixture-of-experts model; {model.name} is dense")
        return None
    if model.n_experts % ep:
        raise ValueError(f"ep={ep} does not divide the {model.n_experts} experts of {model.name}")
    return MoeShape(E=model.n_experts, k=model.experts_per_token, h=model.hidden, fe=model.expert_ffn_hidden,
                    m=_m(model), moe_layers=model.moe_layers, L=model.n_layers, ep=ep, world=cand.sp * cand.dp,
                    expert_params=expert_params(model),
                    extra_live=CLAMPED_SWIGLU_EXTRA_PER_WIDTH if model.clamped_swiglu else 0.0)


# --- model states -----------------------------------------------------------------------------------------------

def expert_state_bytes(ms: MoeShape, stage: int, dtype: str, offload_optimizer: bool,
                       offload_param: bool) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes of routed experts on one GPU: its E / ep experts of every MoE
    layer, sharded by ZeRO ``stage`` over the world / ep ranks holding the same experts (ZeRO-Offload and
    parameter offload move them to the host like the rest of the model)."""
    w, g, o = (2, 2, 12) if dtype == "bf16" else (4, 4, 8)
    psi = ms.expert_params / ms.ep
    nd = ms.world // ms.ep
    weights = psi * w / nd if stage >= 3 else psi * w
    grads = psi * g / nd if stage >= 2 else psi * g
    optim = psi * o / nd if stage >= 1 else psi * o
    if offload_optimizer:
        optim = 0.0
        if stage >= 2:
            grads = 0.0
    if offload_param and stage == 3:
        weights = 0.0  # the partition lives on the host; the gathered layer is counted with the parameters
    return weights, grads, optim


def gathered_layer_params(ms: MoeShape, layer_params: float) -> float:
    """The parameters of one MoE layer ZeRO-3 gathers for its forward or backward: all but the routed experts, and
    the E / ep experts of this rank (experts are never gathered across EP ranks)."""
    return layer_params - ms.expert_layer_params * (1.0 - 1.0 / ms.ep)


def optimizer_params(ms: MoeShape | None, n_params: float, stage: int) -> float:
    """Parameters whose Adam step one GPU runs, before ZeRO's 1/N_d (flops.optimizer_bytes divides at stage >= 1):
    without ZeRO a rank updates only its E / ep experts. At ZeRO >= 1 the expert shard is expert_params / world as
    for the rest, so n_params is unchanged."""
    if ms is None or stage >= 1:
        return n_params
    return n_params - ms.expert_params * (1.0 - 1.0 / ms.ep)


# --- activations --------------------------------------------------------------------------------------------------

EXPERT_LIVE_PER_WIDTH = 3
"""Elements per token copy and unit of f_e the experts op holds while it back-propagates its recomputed forward
(the analytic MLP's recompute-phase live set: gate, up and the down projection's input)."""

CLAMPED_SWIGLU_EXTRA_PER_WIDTH = 3
"""What gpt-oss's gate adds to that live set, per token copy and unit of f_e: its clamped gate, its sigmoid and
``up + 1`` (the interleaved gate/up slices are views; the bias adds are in place of the projection outputs). The
op's backward peak fitted over five shapes: 6.98 k f_e elements per token with gpt-oss's layout against 3.98 with
SiLU's, the other terms equal (``python -m studies.gpt_oss_experts``)."""


def router_kept(ms: MoeShape, e: int) -> float:
    """Bytes per local token the router of one MoE layer keeps for its backward: its logits (E, training dtype, kept
    for the auxiliary loss and the softmax backward), its fp32 probabilities (4E B) and the top-k indices (8k B)."""
    return ms.E * e + ROUTER_FIXED_BYTES_PER_EXPERT * ms.E + INDEX_BYTES * ms.k


def moe_layer_kept(ms: MoeShape, e: int, policy: str) -> float:
    """Bytes per local token one MoE layer keeps beyond a dense MLP of its shared width under ``policy``: the
    router's (:func:`router_kept`) under none/selective; sequence/full recompute the router too: 0. The routed
    experts keep nothing: the compiler's experts op saves its inputs only (the MLP input, counted with the layer,
    and the top-k weights and indices) and rebuilds the rest in its backward (:func:`op_transient`)."""
    if policy in ("sequence", "full"):
        return 0.0
    return router_kept(ms, e)


def kept_bytes_per_token(ms: MoeShape | None, e: int, policy: str) -> float:
    """:func:`moe_layer_kept` averaged over all layers (dense layers keep none of it): the per-layer kept set
    memory.py multiplies by the layer count."""
    if ms is None:
        return 0.0
    return ms.moe_layers / ms.L * moe_layer_kept(ms, e, policy)


def op_transient(ms: MoeShape, e: int) -> float:
    """Bytes per local token the experts op rebuilds in its backward on top of the profile's MLP phase: the
    permutation tensors of each token copy (:data:`OP_PERMUTATION_COPIES` x k x h), what a gate with more
    intermediates than SiLU's adds (gpt-oss, ``ms.extra_live``) and, with ep > 1, the busiest rank's margin on them
    and on the experts' live set (the profile charges the mean)."""
    permutation = OP_PERMUTATION_COPIES * ms.k * ms.h
    live = EXPERT_LIVE_PER_WIDTH * ms.k * ms.fe
    extra = ms.extra_live * ms.k * ms.fe  # a gate with more intermediates (gpt-oss), not in the profile's phase
    return ms.cf * (permutation + extra) * e + (ms.cf - 1.0) * live * e


def transient_bytes_per_token(ms: MoeShape | None, e: int, policy: str) -> float:
    """Bytes per local token a MoE layer's backward holds on top of the profile's MLP phase: what the experts op
    rebuilds (:func:`op_transient`, every policy) and, under sequence/full, the router tensors the recompute
    rebuilds (the other policies keep them)."""
    if ms is None:
        return 0.0
    router = router_kept(ms, e) if policy in ("sequence", "full") else 0.0
    return op_transient(ms, e) + router


# --- communication ------------------------------------------------------------------------------------------------

def dispatch_bytes(ms: MoeShape | None, s: float, e: int) -> float:
    """Bytes one GPU sends in one dispatch (or combine) all-to-all of one MoE layer: its s x k token copies of h
    elements, the (ep - 1) / ep of them whose experts live on other ranks, times the busiest rank's margin."""
    if ms is None or ms.ep <= 1:
        return 0.0
    return s * ms.k * ms.h * e * ms.cf * (ms.ep - 1) / ms.ep


def a2a_buffer_bytes(ms: MoeShape | None, s: float, e: int) -> float:
    """The dispatch staging one MoE layer holds while it runs: the send and receive buffers of the s x k token
    copies (the receive side at the busiest rank's margin); 0 without expert parallelism (copies are gathered in
    place)."""
    if ms is None or ms.ep <= 1:
        return 0.0
    return s * ms.k * ms.h * e * (1.0 + ms.cf)


def all_to_alls_per_layer(recomputed_forwards: int) -> int:
    """Dispatch + combine in the forward, again in the forward the experts op re-runs in its backward, and their
    gradients (6), and 2 more per recomputed MLP forward (the policy's layer recompute)."""
    return 6 + 2 * recomputed_forwards


def dispatch_buffer_bytes(ms: MoeShape | None, s: float, e: int) -> float:
    """The buffer one dispatch or combine all-to-all exchanges per rank: its s x k token copies of h elements at the
    busiest rank's margin (comm.expert_all_to_all_time prices it on the EP group's links); 0 without EP."""
    if ms is None or ms.ep <= 1:
        return 0.0
    return s * ms.k * ms.h * e * ms.cf


def recomputed_expert_flops(ms: MoeShape | None, s: float) -> float:
    """Matmul FLOPs the experts op's backward recomputes in one micro-batch on one GPU: the routed experts' forward
    (s x k token copies through m h x f_e matmuls per MoE layer; the busiest EP rank's margin with ep > 1), which
    the op re-runs because it saves only its inputs. A tiled MLP's recompute (flops.recompute_flops) already counts
    it; 0 for a dense model."""
    if ms is None:
        return 0.0
    return ms.cf * 2.0 * s * ms.k * ms.m * ms.h * ms.fe * ms.moe_layers


def expert_grad_bytes(ms: MoeShape | None, e: int, chunks: int) -> tuple[float, float]:
    """(held while a token piece's backward runs, held when the op's backward ends) bytes of the routed experts'
    weight gradients in one MoE layer's backward (weight dtype, e bytes).

    Per expert, autograd makes its gradients as the expert's matmuls are differentiated, then stacks them into
    the op's two gradients: the gate/up stack (the (m - 1) / m of the weights) is made while every expert's
    pieces are alive, so the op ends at (1 + (m - 1) / m) x the layer's E / ep experts' weights. In token pieces
    (``chunks`` > 1, the MLP tiling knob) the first piece's gradients become the sums the later pieces add into:
    one more copy, held through every later piece. Measured by allocation events on the op (fp32, few tokens):
    1.68x whole, 2.68x in pieces (tests/compiler/test_experts_backward.py)."""
    if ms is None:
        return 0.0, 0.0
    weights = ms.expert_layer_params / ms.ep * e
    sums = weights if chunks > 1 else 0.0
    return sums, sums + weights * (1.0 + (ms.m - 1) / ms.m)


def imbalance_flops_forward(ms: MoeShape | None, s: float) -> float:
    """Extra expert matmul FLOPs of the busiest EP rank in one forward: (CF - 1) x its mean share."""
    if ms is None or ms.ep <= 1:
        return 0.0
    return (ms.cf - 1.0) * 2.0 * s * ms.k * ms.m * ms.h * ms.fe * ms.moe_layers
