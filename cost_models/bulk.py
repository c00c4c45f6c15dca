"""The cost model over many candidates at once: per-GPU memory, step time and tokens/s as numpy arrays.

:func:`autosp.cost_models.estimate.estimate` prices one candidate and is the reference; this module gives the
same three numbers for a whole group of candidates that share a *shape* -- the layout (sp, ring), the
micro-batch (with its dp and grad_accum) and the sequence chunks, i.e. everything :class:`Shapes` reads from a
candidate. Within a group the other knobs (ZeRO stage, checkpointing, MLP and loss tiling, the four offloads,
the overlap schedule) only select among a few values of each term, so:

- every term that depends on the shape alone is computed once per group, by the scalar functions themselves;
- every term that depends on a few knobs with few values (a policy's kept set, a tiling level's working set, a
  ZeRO stage's collectives) is a small table built with the scalar functions and indexed per candidate;
- only the arithmetic that combines them (sums, the max of two phases, exposed = max(0, copy - compute)) is
  written here again, in numpy, in the order of :func:`memory.memory_breakdown` and
  :func:`step_time.step_time_parts`.

tests/cost_models/test_bulk.py checks every candidate of several spaces against the scalar estimate (relative
difference <= 1e-12). A term added to the scalar model must be added here too (that test fails until it is);
:func:`supported` names the inputs this module leaves to the scalar path (it then raises, never guesses).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from autosp.cost_models import chunks, comm, flops, memory, moe, optimizer_offload, param_offload, ring, softcap
from autosp.cost_models.shapes import Shapes
from autosp.contract.knobs import BY_NAME, KNOBS
from autosp.contract.specs import CHECKPOINTING_POLICIES, OVERLAP_SCHEDULES, Candidate, HardwareSpec, ModelSpec, Workload
from autosp.cost_models.step_time import (TILE_OVERHEAD_S, ZERO_OVERLAP_FRACTION, _exposed_attention_comm,
                                          _head_chunks, _zero_times, host_memory_bandwidth, linear_all_to_all_seconds,
                                          linear_core_seconds)

FULL = CHECKPOINTING_POLICIES.index("full")
NONE = CHECKPOINTING_POLICIES.index("none")

ROUNDING_SLACK = 1e-9
"""A relative margin over the bulk model's agreement with the scalar one (1e-12, tests/cost_models/test_bulk.py):
a caller that selects rows by a bulk-priced number widens the test by this much and lets the scalar model decide."""

ROW_KNOBS = ("zero_stage", "offload_optimizer", "offload_param", "checkpointing", "mlp_chunks", "loss_chunks",
             "offload_chunks", "offload_activations", "overlap")
"""The knobs that vary inside a shape group, as arrays: checkpointing and overlap as indices into
CHECKPOINTING_POLICIES and OVERLAP_SCHEDULES, the offloads as booleans, the others as ints."""


@dataclass(frozen=True)
class Bulk:
    """Per-candidate results of one group, in the order of its rows."""

    step: np.ndarray              # TimeBreakdown.step, seconds
    memory: np.ndarray            # MemoryBreakdown.total, bytes per GPU
    tokens_per_second: np.ndarray
    capacity: float
    ceiling: np.ndarray | None = None
    """Tokens/s of the step's FLOP- and byte-priced compute alone (forward, backward and recompute, without the
    tiles' fixed overheads, the optimizer step, exposed communication or offload copies): at least
    ``tokens_per_second``, and the same at every micro-batch, since that compute grows in proportion to the
    micro-batch while the tokens do. So no row trains faster than this at any larger micro-batch
    (tests/cost_models/test_bulk.py asserts both over whole spaces); the quick search bounds a cell by it."""

    @property
    def fits(self) -> np.ndarray:
        return self.memory <= self.capacity


def supported(hw: HardwareSpec) -> str | None:
    """Why this module cannot price candidates on ``hw`` (degenerate links or bandwidths, where the scalar model
    takes its infinite / zero branches), or None."""
    acc = hw.accelerator
    for name, value in (("memory bandwidth", acc.memory_bandwidth), ("peak FLOPs", acc.peak_flops),
                        ("host bandwidth", hw.host_bandwidth * hw.comm_efficiency),
                        ("intra-node bandwidth", hw.intra_node_bandwidth * hw.comm_efficiency),
                        ("inter-node bandwidth", hw.inter_node_bandwidth * hw.comm_efficiency),
                        ("matmul efficiency", hw.matmul_efficiency), ("attention efficiency", hw.attention_efficiency)):
        if not value > 0:
            return f"{name} is {value}"
    return None


def _pick(keys: np.ndarray, table: dict) -> np.ndarray:
    """table[key] for each key of ``keys`` (small non-negative integers: a lookup array indexed by the keys)."""
    if not table:
        return np.zeros(len(keys))
    lookup = np.zeros(max(table) + 1)
    lookup[list(table)] = list(table.values())
    return lookup[keys]


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values of an array of small non-negative integers, ascending (np.unique without its sort)."""
    return np.flatnonzero(np.bincount(values)).tolist() if len(values) else []


_NEUTRAL = {name: BY_NAME[name].default for name in ROW_KNOBS}  # every row knob at its default (the knob table)


def _proxy(base: Candidate, **knobs):
    """The group's candidate with some row knobs set (the others neutral), to call a scalar term with: a plain
    namespace of the Candidate's fields (the scalar terms only read them; building a validated Candidate for each
    of the few dozen calls per group would cost more than the group's arithmetic)."""
    return SimpleNamespace(**{**base.__dict__, **_NEUTRAL, **knobs})


def _xfer(nbytes, bandwidth: float):
    """comm._xfer over an array of byte counts (bandwidth > 0: :func:`supported`)."""
    return np.where(nbytes > 0, nbytes / bandwidth, 0.0)


@dataclass(frozen=True)
class RowSet:
    """A group's row knobs as arrays (:data:`ROW_KNOBS`), with the masks and the distinct values (few per group)
    that the sections below key their small tables on."""

    zero: np.ndarray
    opt: np.ndarray                # optimizer offload
    param: np.ndarray              # parameter offload (only under ZeRO-3)
    ckpt: np.ndarray               # index into CHECKPOINTING_POLICIES
    mlp: np.ndarray
    loss: np.ndarray
    off_chunks: np.ndarray
    off_act: np.ndarray
    overlap: np.ndarray            # index into OVERLAP_SCHEDULES
    n: int
    full: np.ndarray               # checkpointing == "full"
    loss_tiled: np.ndarray
    mlp_tiled: np.ndarray
    policies: list
    mlp_values: list
    loss_values: list
    zeros: list
    projections: dict = field(default_factory=dict, compare=False, repr=False)

    def projection(self, names: tuple[str, ...]) -> tuple["RowSet", np.ndarray]:
        """(the distinct rows of the knobs ``names`` as a RowSet of their own, each row's index into it): a term
        that reads only those knobs is computed once per distinct row and gathered back. Kept with the rows (a
        search prices one RowSet at many shapes)."""
        if names not in self.projections:
            key = np.zeros(self.n, dtype=np.int64)
            for name in names:
                values = np.asarray(getattr(self, name), dtype=np.int64)
                key = key * (int(values.max(initial=0)) + 1) + values
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            sub = _row_set_of(*(getattr(self, name)[first] for name in _ROW_FIELDS))
            self.projections[names] = (sub, inverse.reshape(-1))
        return self.projections[names]

    def subset(self, index: np.ndarray) -> "RowSet":
        """The rows ``index`` of this set, with the projections already built here carried over (the distinct rows
        stay; only each row's index into them is taken)."""
        part = _row_set_of(*(getattr(self, name)[index] for name in _ROW_FIELDS))
        for names, (sub, inverse) in self.projections.items():
            part.projections[names] = (sub, inverse[index])
        return part


_ROW_FIELDS = ("zero", "opt", "param", "ckpt", "mlp", "loss", "off_chunks", "off_act", "overlap")


def _row_set_of(zero, opt, param, ckpt, mlp, loss, off_chunks, off_act, overlap) -> RowSet:
    return RowSet(zero=zero, opt=opt, param=param, ckpt=ckpt, mlp=mlp, loss=loss, off_chunks=off_chunks,
                  off_act=off_act, overlap=overlap, n=len(zero), full=ckpt == FULL, loss_tiled=loss > 1,
                  mlp_tiled=mlp > 1, policies=_distinct(ckpt), mlp_values=_distinct(mlp), loss_values=_distinct(loss),
                  zeros=_distinct(zero))


def row_set(rows: dict) -> RowSet:
    """The row knobs of ``rows`` (arrays of :data:`ROW_KNOBS`) with their masks and distinct values, built once for
    a group whose rows are priced at many shapes (a search's cells share their rows)."""
    zero = np.asarray(rows["zero_stage"])
    return _row_set_of(zero, np.asarray(rows["offload_optimizer"], dtype=bool),
                       np.asarray(rows["offload_param"], dtype=bool) & (zero == 3), np.asarray(rows["checkpointing"]),
                       np.asarray(rows["mlp_chunks"]), np.asarray(rows["loss_chunks"]),
                       np.asarray(rows["offload_chunks"], dtype=bool),
                       np.asarray(rows["offload_activations"], dtype=bool), np.asarray(rows["overlap"]))


STATE_FREE = ("ckpt", "mlp", "loss", "off_chunks", "off_act", "overlap")
"""The row knobs the activations, the compute and the attention's and activation offload's exposed times read: no
ZeRO stage, optimizer or parameter offload. Those terms are computed over the distinct rows of these knobs (a
seventh of a group's rows or fewer) and gathered back (:meth:`RowSet.projection`)."""


STATE_KNOBS = ("zero", "opt", "param", "loss")
"""The row knobs the model states and the optimizer step read (the loss tiling: ZeRO-3's gathered LM head)."""


# ---------------------------------------------------------------------- memory (memory.memory_breakdown)

@dataclass(frozen=True)
class _States:
    """Model states per GPU, bytes: the dense part's weights (with ZeRO-3's gathered copy), gradients and
    optimizer states, and a mixture of experts' routed experts apart."""

    params: np.ndarray
    grads: np.ndarray
    optim: np.ndarray
    gathered: np.ndarray
    expert_w: np.ndarray | None  # None: a dense model
    expert_g: np.ndarray | None
    expert_o: np.ndarray | None

    def at(self, index: np.ndarray) -> "_States":
        """These per-row arrays at rows ``index`` (from a projection's distinct rows back to all rows)."""
        return _States(*(None if a is None else a[index] for a in (self.params, self.grads, self.optim,
                                                                    self.gathered, self.expert_w, self.expert_g,
                                                                    self.expert_o)))


def _model_states(sh: Shapes, workload: Workload, base: Candidate, r: RowSet) -> _States:
    dtype = workload.dtype
    nd = base.sp * base.dp
    ms = sh.moe
    zero, opt, param = r.zero, r.opt, r.param
    dense_psi = sh.n_params - (ms.expert_params if ms else 0)  # routed experts: their own states below
    w_b, g_b, o_b = memory.state_bytes_per_param(dtype)
    params = np.where(zero >= 3, dense_psi * w_b / nd, dense_psi * w_b)
    grads = np.where(zero >= 2, dense_psi * g_b / nd, dense_psi * g_b)
    optim = np.where(zero >= 1, dense_psi * o_b / nd, dense_psi * o_b)
    optim = np.where(opt, 0.0, optim)
    grads = np.where(opt & (zero >= 2), 0.0, grads)
    gathered_elems = np.where(r.loss_tiled, memory.zero3_gathered_params(sh, True),
                              memory.zero3_gathered_params(sh, False))
    gathers = (zero >= 3) & ((nd > 1) | param)
    gathered = np.where(gathers, w_b * gathered_elems, 0.0)
    params = np.where(gathers, np.where(param, gathered, params + gathered), params)
    expert_w = expert_g = expert_o = None  # a dense model: no expert states (the sums below leave them out)
    if ms is not None:  # moe.expert_state_bytes per (ZeRO stage, optimizer offload, parameter offload)
        key = (zero * 2 + opt) * 2 + param
        table = {(z * 2 + o) * 2 + q: moe.expert_state_bytes(ms, z, dtype, bool(o), bool(q))
                 for z in r.zeros for o in (0, 1) for q in (0, 1)}
        expert_w, expert_g, expert_o = (_pick(key, {k: v[i] for k, v in table.items()}) for i in range(3))
    return _States(params=params, grads=grads, optim=optim, gathered=gathered, expert_w=expert_w,
                   expert_g=expert_g, expert_o=expert_o)


@dataclass(frozen=True)
class _Activations:
    """Activation bytes per GPU: one layer's saved set, a sequence chunk's saved set, what stays on the GPU
    through the forward (``kept``) and the backward's peak (``activations``; inf past the host's memory)."""

    per_layer: np.ndarray
    saved_chunk: float
    kept: np.ndarray
    activations: np.ndarray
    host: np.ndarray               # host bytes of the activation and chunk offloads (the optimizer's apart)

    def gathered(self, index: np.ndarray) -> "_Activations":
        """These per-row arrays at rows ``index`` (from a projection's distinct rows back to all rows)."""
        return _Activations(per_layer=self.per_layer[index], saved_chunk=self.saved_chunk, kept=self.kept[index],
                            activations=self.activations[index], host=self.host[index])


def _activation_bytes(sh: Shapes, r: RowSet) -> _Activations:
    """The activations of rows that differ in :data:`STATE_FREE` knobs only (the host's limit: :func:`_over_host`)."""
    e, s, L, N = sh.e, sh.s, sh.L, sh.N
    ms = sh.moe
    ckpt, mlp, off_chunks, off_act = r.ckpt, r.mlp, r.off_chunks, r.off_act
    chunked = N > 1
    recomputed = r.full & chunked
    saved_chunk = s * chunks.saved_bytes_per_token(sh)
    final_norm = memory.outside_layers_bytes(sh)

    def layer_bytes(key):
        policy, tiled = CHECKPOINTING_POLICIES[key[0]], key[1]
        experts = 0.0 if chunked else s * moe.kept_bytes_per_token(ms, e, policy)  # router, permutation buffers
        return memory.layer_kept_bytes(sh, policy, tiled) + experts

    per_key = ckpt * 2 + r.mlp_tiled
    per_layer_table = {p * 2 + t: layer_bytes((p, bool(t))) for p in r.policies for t in (0, 1)}
    per_layer = _pick(per_key, per_layer_table)
    if chunked:
        per_layer = np.where(recomputed, per_layer, saved_chunk + s * moe.kept_bytes_per_token(ms, e, "none"))
    chunk_kv_acc = s * chunks.kv_elems(sh) * chunks.ACCUMULATOR_BYTES
    offloaded_chunks = off_chunks & ~recomputed
    kept = np.where(offloaded_chunks, min(chunks.CHUNK_SAVED_BUFFERS, N) * per_layer / N,
                    np.where(off_act, min(2, L) * per_layer, L * per_layer)) + final_norm
    host = np.where(offloaded_chunks, L * per_layer + chunk_kv_acc, np.where(off_act, L * per_layer, 0.0))
    if chunked:
        transient = _pick(mlp * 2 + off_chunks, {m * 2 + o: chunks.transient_bytes(sh, m, bool(o))
                                                 for m in r.mlp_values for o in (0, 1)})
        layer_set = saved_chunk
        extra = np.where(off_chunks, min(chunks.CHUNK_SAVED_BUFFERS, N) * layer_set / N, layer_set)
        transient = np.where(recomputed, transient + extra, transient)
        host = np.where(recomputed & off_chunks, host + (L * layer_set + chunk_kv_acc) - (L - 1) * layer_set, host)
    else:
        table = {}
        for p in r.policies:  # memory.layer_transient_bytes per (policy, MLP tiles)
            policy = CHECKPOINTING_POLICIES[p]
            experts = moe.transient_bytes_per_token(ms, e, policy)
            for m in r.mlp_values:
                table[p * 1024 + m] = memory.layer_transient_bytes(sh, policy, m, experts)
        transient = _pick(ckpt * 1024 + mlp, table)
    # the layers' backward holds the layers' kept sets, not what is kept outside them (memory.outside_layers_bytes)
    return _Activations(per_layer=per_layer, saved_chunk=saved_chunk, kept=kept,
                        activations=kept - final_norm + transient, host=host)


def _over_host(sh: Shapes, hw: HardwareSpec, base: Candidate, r: RowSet, act: _Activations) -> _Activations:
    """``act`` with the backward's peak infinite where the offloads (activations, chunks, optimizer, parameters)
    need more host memory than there is."""
    nd = base.sp * base.dp
    psi = sh.n_params
    host_total = act.host + np.where(r.opt, 16.0 * psi / nd, 0.0) + np.where(r.param, sh.e * psi / nd, 0.0)
    over_host = (host_total > 0) & (host_total > memory.host_bytes_available(hw))
    return replace(act, activations=np.where(over_host, np.inf, act.activations))


def _memory_total(sh: Shapes, base: Candidate, r: RowSet, st: _States, act: _Activations) -> np.ndarray:
    """MemoryBreakdown.total: the larger of the loss phase and the backward phase, plus the reserve."""
    nd = base.sp * base.dp
    kept, activations, grads, expert_g = act.kept, act.activations, st.grads, st.expert_g
    a2a = memory.a2a_buffer_bytes(sh)
    buffers = a2a + _pick(r.zero, {z: memory.comm_buffer_bytes(sh, _proxy(base, zero_stage=z)) - a2a
                                   for z in r.zeros})
    loss_tables = {c: memory.loss_phase_bytes(sh, _proxy(base, loss_chunks=c)) for c in r.loss_values}
    loss_peak = _pick(r.loss, {c: v[0] for c, v in loss_tables.items()})
    logits = _pick(r.loss, {c: v[1] for c, v in loss_tables.items()})
    loss_phase = kept + loss_peak + a2a
    # a dense model leaves its (zero) expert terms out of the sums: x + 0.0 is x, so the totals are the same bits
    backward_phase = (grads if expert_g is None else grads + expert_g) + buffers + activations + logits
    in_loss = np.isfinite(activations) & (loss_phase > backward_phase)
    grads = np.where(in_loss, 0.0, grads)
    if expert_g is not None:
        expert_g = np.where(in_loss, 0.0, expert_g)
    activations = np.where(in_loss, kept, activations)
    logits = np.where(in_loss, loss_peak, logits)
    buffers = np.where(in_loss, a2a, buffers)
    dynamic = activations + logits + buffers + st.gathered
    reserve = memory.CUDA_CONTEXT_BYTES + (memory.NCCL_BYTES if nd > 1 else 0.0) + memory.FRAGMENTATION * dynamic
    total = st.params + grads + st.optim + activations + logits + buffers + reserve
    return total if expert_g is None else total + (st.expert_w + expert_g + st.expert_o)


# ---------------------------------------------------------------------- compute (step_time.step_time_parts)

@dataclass(frozen=True)
class _Compute:
    """One micro-batch's compute, seconds, and what the communication terms overlap with or scale by."""

    t_fwd: float
    t_bwd: float
    t_recompute: np.ndarray
    t_att_fwd: float               # attention's forward over all layers
    mm_rate: float                 # matmul FLOP/s
    forwards: np.ndarray           # layer forwards recomputed, per row (flops.layer_forwards_recomputed)
    with_attention: np.ndarray     # whether the recompute runs attention again
    forwards_table: dict           # policy index -> flops.layer_forwards_recomputed
    t_proportional: np.ndarray     # forward + backward + FLOP-priced recompute: in proportion to the micro-batch
    # (not gathered: the ceiling is computed over the projection's rows)

    def gathered(self, index: np.ndarray) -> "_Compute":
        """These per-row arrays at rows ``index`` (from a projection's distinct rows back to all rows)."""
        return replace(self, t_recompute=self.t_recompute[index], forwards=self.forwards[index],
                       with_attention=self.with_attention[index])


def _compute_times(model: ModelSpec, hw: HardwareSpec, sh: Shapes, base: Candidate, r: RowSet) -> _Compute:
    acc = hw.accelerator
    mm_rate = acc.peak_flops * hw.matmul_efficiency
    att_rate = acc.peak_flops * hw.attention_efficiency
    mem_bw = acc.memory_bandwidth
    prof, ms, L, N = sh.prof, sh.moe, sh.L, sh.N
    t_mm_fwd = (flops.matmul_flops_forward(sh) + moe.imbalance_flops_forward(ms, sh.s)) / mm_rate  # busiest EP rank
    ring_factor = chunks.compute_factor(sh)
    capped_fwd, capped_bwd = softcap.attention_slowdown(model)  # Gemma 2's attention soft-capping
    t_att_fwd = flops.attention_flops_forward(sh) / att_rate * ring_factor * capped_fwd
    pw_bwd = prof.pw_bwd_factor

    def recompute_key(c, m, l):
        return (c * 2 + m) * 2 + l

    re_key = recompute_key(r.ckpt, r.mlp_tiled, r.loss_tiled)
    re_table, pw_base = {}, None
    for p in r.policies:
        for m in (0, 1):
            for l in (0, 1):
                proxy = _proxy(base, checkpointing=CHECKPOINTING_POLICIES[p], mlp_chunks=2 if m else 1,
                               loss_chunks=2 if l else 1)
                mm_re, att_re = flops.recompute_flops(sh, proxy)
                pw_base, pw_re = flops.pointwise_bytes(sh, proxy)
                re_table[recompute_key(p, m, l)] = (mm_re / mm_rate + att_re / att_rate * ring_factor * capped_fwd
                                                    + pw_re / mem_bw)
                if sh.lin is not None:  # step_time._micro_compute's linear-attention cores
                    re_table[recompute_key(p, m, l)] += linear_core_seconds(hw, sh, proxy.checkpointing)[2]
    t_pw = pw_base / mem_bw
    t_fwd = t_mm_fwd + t_att_fwd + t_pw / (1.0 + pw_bwd)
    t_bwd = (prof.matmul_bwd_factor * t_mm_fwd + prof.attn_bwd_factor * t_att_fwd * capped_bwd / capped_fwd
             + pw_bwd * t_pw / (1.0 + pw_bwd))
    if sh.lin is not None:
        lin_fwd, lin_bwd, _ = linear_core_seconds(hw, sh, "none")
        t_fwd, t_bwd = t_fwd + lin_fwd, t_bwd + lin_bwd
    t_recompute = _pick(re_key, re_table)
    t_proportional = t_fwd + t_bwd + t_recompute  # what grows with the micro-batch (Bulk.ceiling)
    t_recompute = t_recompute + np.where(r.mlp_tiled, TILE_OVERHEAD_S * r.mlp * L * np.where(r.full, 3, 2), 0.0)
    t_recompute = t_recompute + np.where(r.loss_tiled, TILE_OVERHEAD_S * r.loss * 2, 0.0)
    forwards_table = {p: flops.layer_forwards_recomputed(sh, _proxy(base, checkpointing=CHECKPOINTING_POLICIES[p]))
                      for p in r.policies}
    forwards = _pick(r.ckpt, {p: v[0] for p, v in forwards_table.items()})
    with_attention = _pick(r.ckpt, {p: float(v[1]) for p, v in forwards_table.items()}) > 0
    if N > 1:
        t_recompute = t_recompute + TILE_OVERHEAD_S * N * L * (2 + forwards)
    return _Compute(t_fwd=t_fwd, t_bwd=t_bwd, t_recompute=t_recompute, t_att_fwd=t_att_fwd, mm_rate=mm_rate,
                    forwards=forwards, with_attention=with_attention, forwards_table=forwards_table,
                    t_proportional=t_proportional)


# ---------------------------------------------------------------------- communication and host copies

def _optimizer_times(hw: HardwareSpec, sh: Shapes, base: Candidate, r: RowSet, c: _Compute) -> tuple:
    """The optimizer step's seconds and the optimizer offload's exposed copy, per step."""
    nd = base.sp * base.dp
    psi = sh.n_params
    # without ZeRO a rank steps only its E / ep experts (moe.optimizer_params; the same count from stage 1 on)
    local_params = np.where(r.zero >= 1, psi / nd, moe.optimizer_params(sh.moe, psi, 0))
    opt_bytes = flops.OPTIMIZER_BYTES_PER_PARAM * local_params
    # an offloaded step (cost_models/optimizer_offload.py, as step_time._optimizer_times prices it): its terms
    # read the ZeRO stage (3 or not) and parameter offload only
    local, e, ga = psi / nd, sh.e, base.grad_accum
    link = hw.host_bandwidth * hw.comm_efficiency
    hidden = ZERO_OVERLAP_FRACTION * c.t_bwd
    t_host = optimizer_offload.host_step_seconds(local, host_memory_bandwidth(hw) / hw.devices_per_node)
    t_optimizer = np.where(r.opt, t_host, opt_bytes / hw.accelerator.memory_bandwidth)

    def copies(stage: int, params_offloaded: bool) -> float:
        return optimizer_offload.copies_exposed(local, e, stage, params_offloaded, ga, link, hidden)

    # parameter offload implies ZeRO-3; stages 1 and 2 price alike
    copied = np.where(r.param, copies(3, True), np.where(r.zero == 3, copies(3, False), copies(2, False)))
    optimizer_offload_seconds = np.where(r.opt, copied, 0.0)
    return t_optimizer, optimizer_offload_seconds


def _param_fetch_exposed(hw: HardwareSpec, sh: Shapes, base: Candidate, r: RowSet, c: _Compute) -> np.ndarray | None:
    """Parameter offload's exposed fetches per micro-batch (param_offload.fetch_times), the recompute pass only
    under full checkpointing; None where no row offloads its parameters."""
    if not r.param.any():
        return None
    nd = base.sp * base.dp
    link = hw.host_bandwidth * hw.comm_efficiency
    per_pass = (sh.e * sh.n_params / nd) / link
    first = (sh.e * max(sh.layer_params, sh.lm_head_params) / nd) / link

    def fetch_exposed(compute):
        return first + np.maximum(0.0, per_pass - first - ZERO_OVERLAP_FRACTION * compute)

    return np.where(r.param, fetch_exposed(c.t_fwd) + fetch_exposed(c.t_bwd)
                    + np.where(r.full, fetch_exposed(c.t_recompute), 0.0), 0.0)


def _attention_exposed(hw: HardwareSpec, sh: Shapes, base: Candidate, r: RowSet, c: _Compute) -> np.ndarray:
    """The exposed attention communication per micro-batch: Ulysses all-to-alls, then the ring's exchanges."""
    L, La, prof = sh.L, sh.La, sh.prof
    t_q, t_k, t_v, t_o = comm.ulysses_layer_times(hw, sh)
    per_a2a = t_q + t_k + t_v + t_o
    passes = (2 + c.forwards) if sh.N > 1 else np.where(r.full, 3, 2)
    ring_passes = np.where(c.with_attention, 3, 2)
    if per_a2a > 0 and La:
        t_proj_q = 2.0 * sh.s * sh.qproj_params / c.mm_rate
        head_chunks = _head_chunks(sh)
        att_layer_fwd = c.t_att_fwd / La
        ex_fwd = {o: _exposed_attention_comm(OVERLAP_SCHEDULES[o], t_q, t_k, t_v, t_o, t_proj_q, att_layer_fwd,
                                             head_chunks) for o in range(len(OVERLAP_SCHEDULES))}
        ex_bwd = {o: _exposed_attention_comm(OVERLAP_SCHEDULES[o], t_q, t_k, t_v, t_o, 2.0 * t_proj_q,
                                             prof.attn_bwd_factor * att_layer_fwd, head_chunks)
                  for o in range(len(OVERLAP_SCHEDULES))}
        exposed = La * (_pick(r.overlap, ex_fwd) * (passes - 1) + _pick(r.overlap, ex_bwd))
    else:
        exposed = np.zeros(r.n)
    if sh.lin is not None:  # a hybrid's linear-attention all-to-alls, all exposed (step_time._attention_comm)
        exposed = exposed + np.where(r.full, linear_all_to_all_seconds(hw, sh, "full"),
                                     linear_all_to_all_seconds(hw, sh, "none"))
    ring_fwd, ring_fwd_exposed, ring_bwd, ring_bwd_exposed = ring.layer_times(hw, base, sh, c.t_att_fwd / L,
                                                                               prof.attn_bwd_factor)
    return exposed + L * (ring_fwd_exposed * (ring_passes - 1) + ring_bwd_exposed)


def _activation_offload_exposed(hw: HardwareSpec, sh: Shapes, r: RowSet, c: _Compute,
                                act: _Activations) -> np.ndarray:
    """Activation and sequence-chunk offload's exposed copies per micro-batch."""
    e, L, N, n = sh.e, sh.L, sh.N, r.n
    chunked = N > 1
    recomputed = r.full & chunked
    per_layer, saved_chunk = act.per_layer, act.saved_chunk
    link = hw.host_bandwidth * hw.comm_efficiency
    t_fwd_layer = c.t_fwd / L
    t_bwd_layer = (c.t_bwd + c.t_recompute) / L
    offload_micro = np.zeros(n)
    if chunked:
        dram = host_memory_bandwidth(hw) / hw.devices_per_node
        layer_set_off = np.where(recomputed, saved_chunk, per_layer)
        fwd_h2d, _, bwd_h2d_fixed, bwd_d2h = chunks.offload_pass_bytes(sh, 0.0)
        kv_e = sh.s * chunks.kv_elems(sh) * e
        pairs_part = bwd_h2d_fixed  # with per_layer 0 the backward's H2D is its K/V and accumulator pairs alone
        fwd_d2h = layer_set_off
        bwd_h2d = np.maximum(0.0, layer_set_off - kv_e) + pairs_part
        bwd_h2d = np.where(recomputed, bwd_h2d + fwd_h2d, bwd_h2d)
        bwd_d2h = np.where(recomputed, bwd_d2h + fwd_d2h, bwd_d2h)

        def seconds(h2d, d2h):
            t = np.maximum(np.maximum(h2d / link, d2h / link), (h2d + d2h) / dram)
            return np.where((h2d <= 0) & (d2h <= 0), 0.0, t)

        t_f = seconds(np.full(n, fwd_h2d), fwd_d2h)
        t_b = seconds(bwd_h2d, bwd_d2h)
        first_chunk = seconds(layer_set_off / N, np.zeros(n))
        exposed_chunk = np.maximum(0.0, t_f - t_fwd_layer) + np.maximum(0.0, t_b - t_bwd_layer) + first_chunk
        offload_micro = np.where(r.off_chunks, L * exposed_chunk, 0.0)
    act_offload = r.off_act & (recomputed if chunked else True) & (per_layer > 0)
    t_copy = _xfer(per_layer, link)
    return offload_micro + np.where(act_offload, L * (np.maximum(0.0, t_copy - t_fwd_layer)
                                                      + np.maximum(0.0, t_copy - t_bwd_layer)), 0.0)


def _expert_exposed(hw: HardwareSpec, sh: Shapes, r: RowSet, c: _Compute) -> np.ndarray | None:
    """A mixture of experts' dispatch and combine all-to-alls per micro-batch, per (policy, MLP tiles); None
    without expert parallelism (none to add)."""
    ms = sh.moe
    if ms is None or ms.ep <= 1:
        return None
    expert_table = {p * 1024 + m: comm.expert_all_to_all_time(hw, ms, sh.s, sh.e, c.forwards_table[p][0], m)
                    for p in r.policies for m in r.mlp_values}
    return _pick(r.ckpt * 1024 + r.mlp, expert_table)


def _zero_exposed(hw: HardwareSpec, sh: Shapes, base: Candidate, r: RowSet, c: _Compute) -> np.ndarray:
    """ZeRO's exposed collectives per step (a mixture of experts' routed experts over their own group:
    step_time._zero_times)."""
    zero_tables = {z: _zero_times(hw, _proxy(base, zero_stage=z), sh, sh.n_params) for z in r.zeros}
    z_step, z_fwd, z_bwd, z_exposed = (_pick(r.zero, {z: v[i] for z, v in zero_tables.items()}) for i in range(4))
    ga = base.grad_accum
    exposed = z_exposed + np.where((z_fwd != 0) | (z_bwd != 0),
                                   ga * (np.maximum(0.0, z_fwd - ZERO_OVERLAP_FRACTION * c.t_fwd)
                                         + np.maximum(0.0, z_bwd - ZERO_OVERLAP_FRACTION * (c.t_bwd + c.t_recompute))),
                                   0.0)
    return exposed + np.where(r.zero == 3, ga * z_fwd / sh.L, 0.0)


def estimate_group(model: ModelSpec, hw: HardwareSpec, workload: Workload, base: Candidate, rows: dict | RowSet,
                   profile=None) -> Bulk:
    """Memory, step time and tokens/s of the candidates ``base`` with each row of ``rows`` (arrays of
    :data:`ROW_KNOBS`, or their :func:`row_set`) applied. ``base`` sets the shape: sp, ring, dp, micro_batch,
    grad_accum, sequence_chunks and, for a mixture of experts, ep (``sh.moe``: its expert terms, cost_models/moe.py).
    The rows must be canonical candidates (as :meth:`SearchSpace.candidates` yields them)."""
    why = supported(hw)
    if why:
        raise ValueError(f"bulk pricing needs positive rates: {why}")
    if base.world_size > hw.world_size:
        raise ValueError(f"candidate needs {base.world_size} GPUs; {hw.name} has {hw.world_size}")
    sh = Shapes(model, workload, base, profile)
    r = rows if isinstance(rows, RowSet) else row_set(rows)
    # the terms no ZeRO stage or optimizer/parameter offload changes, over the distinct rows of the other knobs
    free, back = r.projection(STATE_FREE)
    act_free = _activation_bytes(sh, free)
    c_free = _compute_times(model, hw, sh, base, free)
    attention_exposed = _attention_exposed(hw, sh, base, free, c_free)[back]
    activation_offload = _activation_offload_exposed(hw, sh, free, c_free, act_free)[back]
    act = _over_host(sh, hw, base, r, act_free.gathered(back))
    c = c_free.gathered(back)

    # the model states and the optimizer step read the ZeRO stage, the offloads of states and the loss tiling only:
    # over their distinct rows (a few dozen), then gathered
    held, held_back = r.projection(STATE_KNOBS)
    states = _model_states(sh, workload, base, held).at(held_back)
    total = _memory_total(sh, base, r, states, act)
    t_optimizer, optimizer_copies = (a[held_back] for a in _optimizer_times(hw, sh, base, held, c_free))
    ga = base.grad_accum
    compute = ga * (c.t_fwd + c.t_bwd + c.t_recompute) + t_optimizer
    experts = _expert_exposed(hw, sh, r, c)  # None, param_fetch None: nothing to add (x + 0.0 is x)
    exposed = ga * (attention_exposed if experts is None else attention_exposed + experts) \
        + _zero_exposed(hw, sh, base, r, c)
    param_fetch = _param_fetch_exposed(hw, sh, base, r, c)
    offload = ga * (activation_offload if param_fetch is None else activation_offload + param_fetch) \
        + optimizer_copies
    step = compute + exposed + offload
    tokens = workload.seq_len * base.micro_batch * base.grad_accum * base.dp
    ok = (step > 0) & np.isfinite(step)
    tps = np.where(ok, tokens / np.where(ok, step, 1.0), 0.0)
    proportional = ga * c_free.t_proportional  # over the distinct rows of the compute's knobs, then gathered
    ceiling = np.where(proportional > 0, tokens / np.where(proportional > 0, proportional, 1.0), np.inf)[back]
    return Bulk(step=step, memory=total, tokens_per_second=tps, capacity=memory.capacity_bytes(hw), ceiling=ceiling)


def shape_of(cand: Candidate) -> tuple:
    """The group key of a candidate: its knobs that are not row knobs (what :class:`Shapes` reads from it)."""
    return tuple(getattr(cand, knob.name) for knob in KNOBS if knob.name not in ROW_KNOBS)


def row_of(cand: Candidate) -> tuple:
    """The candidate's row: its ROW_KNOBS values as the arrays hold them (enumerated knobs as indices)."""
    return tuple(BY_NAME[name].order_key(getattr(cand, name)) for name in ROW_KNOBS)


def estimate_many(model: ModelSpec, hw: HardwareSpec, workload: Workload, cands, profile=None) -> Bulk:
    """:func:`estimate_group` over any list of canonical candidates (grouped by shape), in their order."""
    cands = list(cands)
    groups: dict[tuple, list[int]] = {}
    for i, cand in enumerate(cands):
        groups.setdefault(shape_of(cand), []).append(i)
    step, total, tps = np.empty(len(cands)), np.empty(len(cands)), np.empty(len(cands))
    for indices in groups.values():
        rows = np.array([row_of(cands[i]) for i in indices])
        out = estimate_group(model, hw, workload, cands[indices[0]],
                             {k: rows[:, j] for j, k in enumerate(ROW_KNOBS)}, profile)
        step[indices], total[indices], tps[indices] = out.step, out.memory, out.tokens_per_second
    return Bulk(step=step, memory=total, tokens_per_second=tps, capacity=memory.capacity_bytes(hw))


__all__ = ["Bulk", "ROUNDING_SLACK", "ROW_KNOBS", "RowSet", "estimate_group", "estimate_many", "row_of", "row_set",
           "shape_of", "supported"]
