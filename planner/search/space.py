"""The search space: which candidates exist for a (model, hardware, workload), and why others do not.

A candidate (:class:`autosp.contract.specs.Candidate`) sets every knob the compiler applies. The space
is the product of the knob choices below, cut down by the validity rules; :func:`invalid_reason`
returns the first rule a candidate breaks (one line, for the report and the errors) or ``None``.

Knobs and choices

- ``sp``: a divisor of the world size. An SP group inside a node divides the node; one spanning nodes
  tiles whole nodes (sp a multiple of the devices per node). Groups spanning nodes are searched by
  default and priced by the cost model (their all-to-alls or ring steps use the inter-node links);
  ``allow_cross_node_sp=False`` (``autosp-plan --no-cross-node-sp``) keeps every SP group inside a node.
- ``ring``: the ring-attention degree R of the SP group (2-D SP: sp = U x R, U = sp / ring Ulysses ranks
  of consecutive GPUs, R ring ranks strided by U). R = 1 is pure Ulysses, R = sp a pure ring.
- ``dp = world / sp``; every rank is in exactly one SP group and one DP group.
- ``zero_stage``: 0-3 (model states sharded over all dp x sp ranks, docs/design.md section 3).
- ``micro_batch`` in :data:`MICRO_BATCHES`; ``grad_accum`` follows from ``--global-batch``:
  global_batch = dp x micro_batch x grad_accum sequences. Without a global batch, grad_accum is 1 and a
  step trains dp x micro_batch sequences.
- ``checkpointing``: none / selective / sequence / full.
- ``mlp_chunks`` in :data:`MLP_CHUNKS`, ``loss_chunks`` in :data:`LOSS_CHUNKS` (sequence tiling).
- ``offload_activations``: the checkpointed tensors in host memory.
- ``offload_optimizer``: ZeRO-Offload (master weights, Adam states and the step on the host, CPU Adam).
- ``offload_param``: ZeRO-3 parameter offload (each rank's bf16 weight partition on the host, fetched
  layer by layer: cost_models/param_offload.py).
- ``ep``: expert parallelism of a mixture-of-experts model (cost_models/moe.py): the EP group of ``ep``
  consecutive ranks (SP and DP ranks alike) splits every MoE layer's experts; 1 for a dense model, whose space
  keeps its size.
- ``overlap``: none / kv_async / head_pipeline.
- ``sequence_chunks`` in :data:`SEQUENCE_CHUNKS`: each decoder layer runs over the rank's tokens in that many
  chunks (cost_models/chunks.py); ``offload_chunks``: the chunks' saved tensors and the dK/dV accumulators
  live in host memory. A chunked layer is checkpointed like attention: kept (its layer input, K/V and attention
  output) under ``none``, ``selective`` and ``sequence`` alike; recomputed under ``full`` (then only its input is
  kept, and activation offload moves that).

The couplings between knobs (e.g. activation offload needs a checkpointing policy) are the rule table
:data:`autosp.contract.rules.RULES`, each with its reason; every function below reads it.

Validity rules (docs/design.md section 2)

- the Ulysses degree U carries the head rules: query heads divide by U; KV heads either divide by U
  (sharded) or divide U (replicated U / n_kv times before the all-to-all); anything else is invalid. The
  ring has no head rule, so an SP degree above the head count is reached through R;
- R divides sp; U divides the devices of a node or is a multiple of them (a Ulysses group never straddles
  a node boundary part-way);
- ``head_pipeline`` needs at least two local query heads (heads / U) to pipeline;
- a hybrid model's Gated DeltaNet layers (cost_models/linear_attention.py ``plan_reason``, the compiler's rule): no
  ring (R = 1) and no sequence chunks, and U divides the linear value heads and divides or is divided by the
  linear key heads;
- the knob rules of :data:`autosp.contract.rules.RULES` but the search's own (a plan may offload its parameters
  without its optimizer; the search only proposes the pair);
- a sequence that does not divide by sp (of lcm(sp, 2R) with a ring: 2R zigzag chunks over U ranks) is padded up
  (pad tokens carry ignored labels): valid, and :func:`padding` says how much is wasted;
- ``ep`` (mixture-of-experts models only; :func:`ep_choices`): divides the experts and the world, and, like a
  Ulysses group, divides a node or is a multiple of its GPUs (an EP group never straddles a node part-way);
- tiling: a chunk count above 1 must leave tiles of at least :data:`MIN_TILE_TOKENS` tokens of the
  tokens one rank holds (padded length / sp); so short contexts are not tiled and long ones may be
  tiled finely (ALST tiles its MLP in about seq_len / hidden pieces); sequence chunks hold at least
  :data:`MIN_SEQUENCE_CHUNK_TOKENS`;
- with a global batch, it must split evenly into dp x micro_batch x grad_accum.

Pinned knobs (``--fix``, :func:`restrict`): a pinned knob's choices are the pinned value alone, and
:meth:`SearchSpace.reason` refuses a candidate that does not keep every pin.

Canonical form (:func:`canonical`, :func:`make_candidate`): a knob a rule of the table says cannot apply takes
the rule's off value, so no two candidates of the space mean the same training run. :data:`SPACE_VERSION`
changes whenever this file or the rule table changes; plan caches key on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from autosp.contract import rules
from autosp.cost_models import linear_attention
from autosp.cost_models.shapes import padding_multiple
from autosp.contract.knobs import BY_NAME, SEARCHED
from autosp.contract.specs import CHECKPOINTING_POLICIES, OVERLAP_SCHEDULES, Candidate, HardwareSpec, ModelSpec, Workload

ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8)
MLP_CHUNKS = (1, 2, 4, 8, 16, 32, 64)
LOSS_CHUNKS = (1, 2, 4, 8, 16, 32, 64, 128)
SEQUENCE_CHUNKS = (1, 4, 16, 64)
"""Sequence chunks of a decoder layer the search offers (the cost model and the compiler take any count).
Every fourth power of two: each extra choice multiplies the space (x 2 with chunk offload), and at the longest
contexts the device memory of a chunked, offloaded layer is mostly full-length tensors by 64 chunks
(residual gradients, the final norm, the tiled loss's hidden-state gradient: cost_models/chunks.py)."""
MIN_SEQUENCE_CHUNK_TOKENS = 8192
"""A sequence chunk holds at least this many of a rank's tokens. A space rule, not a cost: shorter chunks
save memory only where the layer's working set is already small, and multiply all-to-all latencies, per-chunk
overheads and (offloaded) the K/V chunk transfers, which grow with N^2; the cost model prices any count."""
OFFLOAD = (False, True)
MIN_TILE_TOKENS = 1024
"""A tiled MLP or logits+loss chunk holds at least this many tokens: smaller tiles only add kernel
launches and lose GEMM efficiency while saving memory that no longer matters."""

from autosp.planner.search.space_version import SPACE_REVISION, SPACE_VERSION  # noqa: E402  (a hit reads it alone)


CROSS_NODE_FLAG = "--no-cross-node-sp"
"""The autosp-plan flag that keeps every SP group inside one node (named in the reasons below)."""


@functools.lru_cache(maxsize=1024)
def _padding_multiple(sp: int, ring: int) -> int:
    return padding_multiple(Candidate(sp=sp, ring=ring))  # memoised: the searches ask for it per candidate


def padded_length(seq_len: int, sp: int, ring: int = 1) -> int:
    """The sequence length after padding to a multiple of ``sp`` (of lcm(sp, 2 x ring) with a ring: zigzag chunks)."""
    multiple = _padding_multiple(sp, ring)
    return -(-seq_len // multiple) * multiple


def padding(seq_len: int, sp: int, ring: int = 1) -> tuple[int, float]:
    """(pad tokens, fraction of the padded sequence that is padding)."""
    padded = padded_length(seq_len, sp, ring)
    return padded - seq_len, (padded - seq_len) / padded


def local_tokens(seq_len: int, sp: int, ring: int = 1) -> int:
    """Tokens of one sequence held by one rank of the SP group."""
    return padded_length(seq_len, sp, ring) // sp


def tile_ok(chunks: int, tokens: int) -> bool:
    """Whether ``chunks`` tiles of ``tokens`` tokens each hold at least MIN_TILE_TOKENS (1 always does)."""
    return chunks == 1 or tokens // chunks >= MIN_TILE_TOKENS


def sequence_chunks_ok(chunks: int, tokens: int) -> bool:
    """Whether ``chunks`` sequence chunks of ``tokens`` tokens each hold at least MIN_SEQUENCE_CHUNK_TOKENS."""
    return chunks == 1 or tokens // chunks >= MIN_SEQUENCE_CHUNK_TOKENS


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _placement_reason(hw: HardwareSpec, sp: int, allow_cross_node_sp: bool) -> str | None:
    """Why an SP group of ``sp`` consecutive ranks cannot be placed on this cluster, or None."""
    world, per_node = hw.world_size, hw.devices_per_node
    if sp < 1 or world % sp:
        return f"sp={sp} does not divide the world size {world}"
    if sp > per_node:
        if not allow_cross_node_sp:
            return (f"sp={sp} spans nodes ({per_node} GPUs per node) and {CROSS_NODE_FLAG} keeps SP groups "
                    f"inside a node")
        if sp % per_node:
            return f"sp={sp} would split a node of {per_node} GPUs between SP groups"
    elif per_node % sp:
        return f"sp={sp} does not divide the {per_node} GPUs of a node"
    return None


def layout_reason(model: ModelSpec, hw: HardwareSpec, sp: int, ring: int = 1,
                  allow_cross_node_sp: bool = True) -> str | None:
    """Why the SP layout sp = U x ``ring`` is impossible for this model and cluster, or None.

    The head rules bind the Ulysses degree U = sp / ring (the ring has none)."""
    reason = _placement_reason(hw, sp, allow_cross_node_sp)
    if reason:
        return reason
    if ring < 1 or sp % ring:
        return f"ring={ring} does not divide sp={sp}"
    u = sp // ring
    name = f"sp={sp}" if ring == 1 else f"ulysses={u} (sp={sp} / ring={ring})"
    if model.n_heads % u:
        return f"{model.n_heads} query heads do not divide by {name}"
    kv = model.n_kv_heads
    if u > 1 and kv % u and u % kv:
        return f"{kv} KV heads neither divide by {name} nor divide it"
    reason = linear_attention.plan_reason(model, ring, 1, u)  # a hybrid's Gated DeltaNet layers: no ring, their heads
    if reason:
        return reason
    per_node = hw.devices_per_node
    if u > per_node and u % per_node or u < per_node and per_node % u:
        return f"a Ulysses group of {u} would straddle a node of {per_node} GPUs part-way"
    return None


def ring_choices(model: ModelSpec, hw: HardwareSpec, sp: int, allow_cross_node_sp: bool = True) -> tuple[int, ...]:
    """The ring degrees that make a valid layout of ``sp`` (1 = pure Ulysses, sp = pure ring)."""
    if _placement_reason(hw, sp, allow_cross_node_sp):
        return ()
    return tuple(r for r in divisors(sp) if layout_reason(model, hw, sp, r, allow_cross_node_sp) is None)


def sp_reason(model: ModelSpec, hw: HardwareSpec, sp: int, allow_cross_node_sp: bool = True) -> str | None:
    """Why SP degree ``sp`` is impossible for this model and cluster with every ring degree, or None."""
    reason = _placement_reason(hw, sp, allow_cross_node_sp)
    if reason:
        return reason
    if ring_choices(model, hw, sp, allow_cross_node_sp):
        return None
    return layout_reason(model, hw, sp, 1, allow_cross_node_sp)  # no U x R split works: say why U = sp fails


def ep_choices(model: ModelSpec, hw: HardwareSpec) -> tuple[int, ...]:
    """The expert-parallel degrees of ``model`` on ``hw``: (1,) for a dense model; else the divisors of the world
    that divide the experts and divide a node or are a multiple of its GPUs."""
    if not model.n_experts:
        return (1,)
    per_node = hw.devices_per_node
    return tuple(d for d in divisors(hw.world_size) if model.n_experts % d == 0
                 and (per_node % d == 0 if d <= per_node else d % per_node == 0))


def ep_reason(model: ModelSpec, hw: HardwareSpec, ep: int) -> str | None:
    """Why expert-parallel degree ``ep`` is impossible for this model and cluster, or None."""
    if ep == 1:
        return None
    if not model.n_experts:
        return f"ep={ep} needs a mixture-of-experts model; {model.name} is dense"
    if model.n_experts % ep:
        return f"ep={ep} does not divide the {model.n_experts} experts"
    if ep not in ep_choices(model, hw):
        return (f"ep={ep} does not divide the world of {hw.world_size} GPUs or would straddle a node of "
                f"{hw.devices_per_node} GPUs part-way")
    return None


def heads_reason(model: ModelSpec, overlap: str, ulysses: int) -> str | None:
    """Why ``model``'s heads cannot pipeline with a Ulysses degree of ``ulysses`` (head_pipeline), or None."""
    if overlap == "head_pipeline" and model.n_heads // ulysses < 2:
        return (f"head_pipeline needs at least 2 local query heads, ulysses={ulysses} leaves "
                f"{model.n_heads // ulysses}")
    return None


def invalid_reason(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
                   allow_cross_node_sp: bool = True) -> str | None:
    """The first validity rule ``cand`` breaks, as one line; None when it is valid and canonical."""
    if cand.sp * cand.dp != hw.world_size:
        return f"sp x dp = {cand.sp} x {cand.dp} is not the world size {hw.world_size}"
    reason = layout_reason(model, hw, cand.sp, cand.ring, allow_cross_node_sp)
    if reason:
        return reason
    reason = rules.reason(cand, rules.PLANNER)
    if reason:
        return reason
    reason = heads_reason(model, cand.overlap, cand.ulysses)
    if reason:
        return reason
    reason = ep_reason(model, hw, cand.ep)
    if reason:
        return reason
    tokens = local_tokens(workload.seq_len, cand.sp, cand.ring)
    for name in ("mlp_chunks", "loss_chunks"):
        chunks = getattr(cand, name)
        if not tile_ok(chunks, tokens):
            return (f"{name}={chunks} would cut the {tokens} tokens per rank into tiles smaller than "
                    f"{MIN_TILE_TOKENS}")
    if not sequence_chunks_ok(cand.sequence_chunks, tokens):
        return (f"sequence_chunks={cand.sequence_chunks} would cut the {tokens} tokens per rank into chunks smaller "
                f"than {MIN_SEQUENCE_CHUNK_TOKENS}")
    reason = linear_attention.plan_reason(model, 1, cand.sequence_chunks, cand.ulysses)
    if reason:
        return reason
    gb = workload.global_batch
    if gb is None:
        if cand.grad_accum != 1:
            return "grad_accum > 1 needs --global-batch"
    else:
        if gb % cand.dp:
            return f"global batch {gb} does not divide by dp={cand.dp}"
        if (gb // cand.dp) % cand.micro_batch:
            return f"global batch {gb} / dp={cand.dp} does not divide by micro_batch={cand.micro_batch}"
        if gb != cand.dp * cand.micro_batch * cand.grad_accum:
            return (f"dp x micro_batch x grad_accum = {cand.dp * cand.micro_batch * cand.grad_accum} "
                    f"is not the global batch {gb}")
    return None


def canonical(cand: Candidate) -> Candidate:
    """``cand`` with every knob a rule of the table says cannot apply at its off value (:func:`rules.settle`), so
    equal training runs compare equal."""
    knobs = vars(cand)
    settled = rules.settle(knobs)
    changes = {name: value for name, value in settled.items() if value != knobs[name]}
    return replace(cand, **changes) if changes else cand


_SEARCHED_NAMES = frozenset(SEARCHED)


def make_candidate(world: int, global_batch: int | None, **knobs) -> Candidate:
    """A canonical candidate from knob values (the searched knobs of autosp.contract.knobs; those not given take
    their defaults, ``sp`` must be given); dp and grad_accum follow from the world and global batch.

    When the global batch does not split into dp x micro_batch, grad_accum stays 1 and
    :func:`invalid_reason` reports the problem.
    """
    unknown = sorted(knobs.keys() - _SEARCHED_NAMES)
    if unknown:
        raise TypeError(f"make_candidate() got knobs it does not search: {', '.join(unknown)}")
    k = {name: knobs.get(name, BY_NAME[name].default) for name in SEARCHED}
    dp = world // k["sp"]
    grad_accum = 1
    if global_batch is not None and global_batch % (dp * k["micro_batch"]) == 0:
        grad_accum = global_batch // (dp * k["micro_batch"])
    return Candidate(dp=dp, grad_accum=grad_accum, **rules.settle(k))


@dataclass(frozen=True)
class SearchSpace:
    """The knob choices for one request; :meth:`candidates` enumerates the valid canonical points."""

    model: ModelSpec
    hardware: HardwareSpec
    workload: Workload
    allow_cross_node_sp: bool = True
    sp: tuple[int, ...] = ()
    excluded_sp: tuple[tuple[int, str], ...] = ()
    ring: tuple[int, ...] = (1,)
    zero_stage: tuple[int, ...] = ZERO_STAGES
    micro_batch: tuple[int, ...] = MICRO_BATCHES
    checkpointing: tuple[str, ...] = CHECKPOINTING_POLICIES
    mlp_chunks: tuple[int, ...] = MLP_CHUNKS
    loss_chunks: tuple[int, ...] = LOSS_CHUNKS
    offload_activations: tuple[bool, ...] = OFFLOAD
    overlap: tuple[str, ...] = OVERLAP_SCHEDULES
    offload_optimizer: tuple[bool, ...] = OFFLOAD
    sequence_chunks: tuple[int, ...] = SEQUENCE_CHUNKS
    offload_chunks: tuple[bool, ...] = OFFLOAD
    offload_param: tuple[bool, ...] = OFFLOAD
    ep: tuple[int, ...] = (1,)
    fixed: tuple[tuple[str, object], ...] = ()
    """Pinned knobs (``--fix``, :mod:`autosp.planner.pins`): (name, value) pairs every candidate must keep;
    their choices above are already restricted to the pinned value."""
    profile: object = field(default=None, compare=False, repr=False)
    """The model's :class:`~autosp.cost_models.profile.ModelProfile` when it is graph-derived (a model that
    is not a preset); None prices ``model`` with the analytic profile. Travels with :meth:`with_workload`."""

    KNOBS = SEARCHED  # the knob table's searched knobs (autosp.contract.knobs), in its order

    def choices(self) -> dict[str, tuple]:
        return {name: getattr(self, name) for name in self.KNOBS}

    def pinned(self) -> dict:
        """The searched knobs a pin sets (``--fix``; a ``dp`` pin sets sp), with the pinned value."""
        names = {"sp" if name == "dp" else name for name, _ in self.fixed}
        return {name: getattr(self, name)[0] for name in self.KNOBS if name in names and getattr(self, name)}

    def make(self, **knobs) -> Candidate:
        """The canonical candidate of ``knobs``, every pinned knob set to its pinned value whatever ``knobs``
        say: every strategy (warm starts, sweeps, climbs, completions) builds its candidates here, so none can
        lose a pin by accident. A pin the canonical form cannot keep beside the other knobs (activation offload
        without checkpointing) leaves a candidate that :meth:`reason` refuses. A caller that does not name ``ep``
        gets the space's first (1 unless pinned)."""
        knobs.setdefault("ep", self.ep[0])
        if self.fixed:
            knobs.update(self.pinned())
        return make_candidate(self.hardware.world_size, self.workload.global_batch, **knobs)

    def admits(self, cand: Candidate) -> bool:
        """Whether ``cand`` is a point of this space: valid, keeping every pin, each knob one of the space's
        choices (what a sampler can be told about: Optuna refuses an enqueued value outside them)."""
        return self.reason(cand) is None and all(getattr(cand, k) in getattr(self, k) for k in self.KNOBS)

    def rings_for(self, sp: int) -> tuple[int, ...]:
        """The ring degrees of this space that make a valid layout of ``sp``."""
        return tuple(r for r in ring_choices(self.model, self.hardware, sp, self.allow_cross_node_sp)
                     if r in self.ring)

    def make_nearest(self, **knobs) -> Candidate:
        """Like :meth:`make`, but a ring degree, tiling level or micro-batch that is invalid with the chosen sp
        is moved to the nearest valid one below it (for samplers that propose knobs independently)."""
        knobs.setdefault("ring", 1)
        rings = self.rings_for(knobs["sp"])
        if rings and knobs["ring"] not in rings:
            below = [r for r in rings if r <= knobs["ring"]]
            knobs = dict(knobs, ring=below[-1] if below else rings[0])
        per = self.per_layout_choices(knobs["sp"], knobs["ring"])
        if per is not None:
            for name, valid in per.items():  # the counted knobs the layout narrows (tiling, micro-batch)
                if BY_NAME[name].kind is not int or name not in knobs:
                    continue
                if valid and knobs[name] not in valid:
                    below = [v for v in valid if v <= knobs[name]]
                    knobs = dict(knobs, **{name: below[-1] if below else valid[0]})
        return self.make(**knobs)

    def min_seq_len(self, cand: Candidate) -> int:
        """The shortest sequence at which ``cand``'s tiling is valid (tiles of MIN_TILE_TOKENS)."""
        chunks = max(cand.mlp_chunks, cand.loss_chunks)
        tiles = 1 if chunks == 1 else cand.sp * chunks * MIN_TILE_TOKENS
        seq = 1 if cand.sequence_chunks == 1 else cand.sp * cand.sequence_chunks * MIN_SEQUENCE_CHUNK_TOKENS
        return max(tiles, seq)

    def reason(self, cand: Candidate, workload: Workload | None = None) -> str | None:
        reason = invalid_reason(self.model, self.hardware, workload or self.workload, cand, self.allow_cross_node_sp)
        if reason is None and self.fixed:
            reason = pin_reason(cand, self.fixed)
        return reason

    def with_workload(self, workload: Workload) -> "SearchSpace":
        """The space of the same request at another workload (the tiling choices depend on its length); this
        space itself at its own workload (it keeps the per-layout choices it has worked out)."""
        if workload == self.workload:
            return self
        return build_space(self.model, self.hardware, workload, self.allow_cross_node_sp, profile=self.profile,
                           fixed=self.fixed)

    def lean_micro_batch(self) -> "SearchSpace":
        """This space with micro-batch 1 only, or its one pinned micro-batch (a bigger micro-batch never fits
        a longer sequence: what the max-ctx searches explore)."""
        return replace(self, micro_batch=(1,) if 1 in self.micro_batch else self.micro_batch[:1])

    def per_layout_choices(self, sp: int, ring: int) -> dict[str, tuple] | None:
        """The knob values valid together with the layout sp = (sp / ring) x ring (the tiling levels its tokens
        allow, the micro-batches its dp splits the batch into, the overlap schedules its Ulysses degree and heads
        allow); the couplings of the rule table between the other knobs stay. Kept per space (a search asks for each
        layout's several times; the space is frozen); the caller must not change the dict."""
        memo = self._per_layout_memo
        if (sp, ring) not in memo:
            memo[(sp, ring)] = self._per_layout_choices(sp, ring)
        return memo[(sp, ring)]

    @functools.cached_property
    def _per_layout_memo(self) -> dict:
        return {}

    def _per_layout_choices(self, sp: int, ring: int) -> dict[str, tuple] | None:
        if ring not in self.ring or layout_reason(self.model, self.hardware, sp, ring, self.allow_cross_node_sp):
            return None
        tokens = local_tokens(self.workload.seq_len, sp, ring)
        gb, dp = self.workload.global_batch, self.hardware.world_size // sp
        if gb is None:
            micro = self.micro_batch
        else:
            accum = dict(self.fixed).get("grad_accum")  # a pinned grad_accum leaves one micro-batch per layout
            micro = tuple(m for m in self.micro_batch if gb % (dp * m) == 0
                          and (accum is None or gb == dp * m * accum))
        ulysses = sp // ring
        overlap = tuple(o for o in self.overlap if rules.allows(dict(overlap=o, sp=sp, ring=ring))
                        and heads_reason(self.model, o, ulysses) is None)
        narrowed = {"micro_batch": micro, "overlap": overlap,
                    "mlp_chunks": tuple(c for c in self.mlp_chunks if tile_ok(c, tokens)),
                    "loss_chunks": tuple(c for c in self.loss_chunks if tile_ok(c, tokens)),
                    "sequence_chunks": tuple(c for c in self.sequence_chunks if sequence_chunks_ok(c, tokens)
                                             and (c == 1 or not self.model.linear_layers))}
        return {name: narrowed.get(name, getattr(self, name)) for name in self.KNOBS if name not in ("sp", "ring")}

    def layouts(self):
        """The valid (sp, ring) pairs of this space, in a fixed order."""
        for sp in self.sp:
            for ring in self.rings_for(sp):
                yield sp, ring

    def usable_layouts(self):
        """(sp, ring, per-layout choices) of every layout where each knob has a value that goes with it (a knob
        pinned, or tiled too finely at that layout's local tokens, can leave none), in :meth:`layouts` order."""
        for sp, ring in self.layouts():
            per = self.per_layout_choices(sp, ring)
            if per is not None and all(per.values()):
                yield sp, ring, per

    def candidates(self):
        """Every valid canonical candidate, in a fixed order (deterministic searches and ties)."""
        for sp, ring in self.layouts():
            per = self.per_layout_choices(sp, ring)
            if per is None:
                continue
            for k in rules.combinations(dict(per, sp=(sp,), ring=(ring,))):
                yield self.make(**k)

    def size(self) -> int:
        """len(list(self.candidates())), without building them."""
        total = 0
        for sp, ring in self.layouts():
            per = self.per_layout_choices(sp, ring)
            if per is not None:
                total += rules.count(dict(per, sp=(sp,), ring=(ring,)))
        return total

    def neighbours(self, cand: Candidate):
        """Valid candidates one move away from ``cand`` (for local refinement).

        A move changes one knob; changing sp also tries every ring degree of the new sp (the layout moves as
        one), every overlap schedule (a pure ring or sp = 1 has none to keep) and the micro-batch that keeps
        the tokens per GPU constant (sp and micro-batch trade); changing the ring also tries every overlap
        schedule (the Ulysses degree changes with it).
        """
        base = {k: getattr(cand, k) for k in self.KNOBS}
        choices = self.choices()
        seen = {cand}
        for name in self.KNOBS:
            for value in choices[name]:
                if value == base[name]:
                    continue
                variants = [{name: value}]
                if name == "sp":
                    scaled = base["micro_batch"] * value // base["sp"]
                    micro = {base["micro_batch"]}
                    if scaled * base["sp"] == base["micro_batch"] * value and scaled in choices["micro_batch"]:
                        micro.add(scaled)
                    variants = [{"sp": value, "ring": r, "micro_batch": m, "overlap": o}
                                for r in self.rings_for(value) for m in sorted(micro) for o in choices["overlap"]]
                elif name == "ring":
                    if base["sp"] % value:
                        continue
                    variants = [{"ring": value, "overlap": o} for o in choices["overlap"]]
                for change in variants:  # make() settles what the move leaves broken (no overlap on a pure ring)
                    other = self.make(**{**base, **change})
                    if other not in seen and not self.reason(other):
                        seen.add(other)
                        yield other


def build_space(model: ModelSpec, hw: HardwareSpec, workload: Workload, allow_cross_node_sp: bool = True,
                micro_batches: tuple[int, ...] | None = None, profile=None, fixed=()) -> SearchSpace:
    """The space for one request. ``micro_batches`` overrides the micro-batch choices (max-ctx uses 1);
    ``profile`` is the model's graph-derived ModelProfile (None: the analytic one of ``model``).
    ``allow_cross_node_sp=False`` keeps every SP group inside a node (``autosp-plan --no-cross-node-sp``).
    ``fixed``: pinned knobs, (name, value) pairs (:func:`autosp.planner.pins.pin_space`; a UsageError when
    a pin cannot hold on this model and cluster)."""
    valid, excluded, rings = [], [], set()
    for sp in divisors(hw.world_size):
        reason = sp_reason(model, hw, sp, allow_cross_node_sp)
        if reason is None:
            valid.append(sp)
            rings.update(ring_choices(model, hw, sp, allow_cross_node_sp))
        else:
            excluded.append((sp, reason))
    mb = MICRO_BATCHES if micro_batches is None else tuple(micro_batches)
    # tiling levels no sp can use at this length are left out (they would only waste samples)
    most = local_tokens(workload.seq_len, min(valid)) if valid else 0
    mlp = tuple(c for c in MLP_CHUNKS if tile_ok(c, most)) or (1,)
    loss = tuple(c for c in LOSS_CHUNKS if tile_ok(c, most)) or (1,)
    seq = tuple(c for c in SEQUENCE_CHUNKS if sequence_chunks_ok(c, most)) or (1,)
    if model.linear_layers:  # a hybrid's linear layers carry their state across chunks: none (linear_attention.py)
        seq = (1,)
    if workload.global_batch is not None:
        # Only micro-batches that can divide some replica's share of the global batch.
        mb = tuple(m for m in mb if any(workload.global_batch % (hw.world_size // sp * m) == 0 for sp in valid))
        mb = mb or (1,)
    space = SearchSpace(model=model, hardware=hw, workload=workload, allow_cross_node_sp=allow_cross_node_sp,
                        sp=tuple(valid), excluded_sp=tuple(excluded), ring=tuple(sorted(rings)) or (1,),
                        micro_batch=mb, mlp_chunks=mlp, loss_chunks=loss, sequence_chunks=seq,
                        ep=ep_choices(model, hw), profile=profile)
    return restrict(space, tuple(fixed)) if fixed else replace(space, **implied_choices(space))


def _shown(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def pin_reason(cand: Candidate, pins) -> str | None:
    """The first pin (name, value) ``cand`` does not keep, as one line, or None."""
    for name, value in pins:
        if getattr(cand, name) != value:
            return f"{name} is pinned to {_shown(value)} (--fix), this candidate has {_shown(getattr(cand, name))}"
    return None


def restrict(space: SearchSpace, pins) -> SearchSpace:
    """``space`` with each pinned knob's choices reduced to the pinned value (``dp`` pins sp = world / dp), and
    the other knobs' choices to the values the canonical form lets stand beside them (:func:`implied_choices`):
    so the first choice of every knob, where the strategies start, keeps the pins. The candidates must also
    keep every pin (:meth:`SearchSpace.reason`). :func:`autosp.planner.pins.check_pins` says in one line why
    pins cannot hold."""
    changes = {}
    world = space.hardware.world_size
    for name, value in pins:
        if name == "dp":
            name, value = "sp", world // value if value and world % value == 0 else 0
        if name in space.KNOBS:
            changes[name] = (value,)
    restricted = replace(space, fixed=tuple(pins), **changes)
    return replace(restricted, **implied_choices(restricted))


def implied_choices(space: SearchSpace) -> dict[str, tuple]:
    """The knob choices of ``space`` that change when narrowed to the values some canonical candidate can take
    together with every knob that has a single choice (a pin, or a space with one value; :func:`rules.narrow`: the
    rule table read both ways, e.g. no chunk offload without a choice of sequence chunks). An empty tuple: the
    single values exclude each other."""
    pinned = set(space.pinned())  # never narrowed here: pins that exclude each other are said by pins.check_pins
    choices = space.choices()
    narrowed, _ = rules.narrow(choices, keep=pinned)
    return {name: values for name, values in narrowed.items() if values != choices[name]}


__all__ = ["CROSS_NODE_FLAG", "LOSS_CHUNKS", "MICRO_BATCHES", "MIN_SEQUENCE_CHUNK_TOKENS", "MIN_TILE_TOKENS",
           "MLP_CHUNKS", "OFFLOAD", "SEQUENCE_CHUNKS", "SPACE_REVISION", "SPACE_VERSION", "SearchSpace",
           "ZERO_STAGES", "build_space", "canonical", "divisors", "ep_choices", "ep_reason", "heads_reason",
           "implied_choices", "invalid_reason", "layout_reason", "local_tokens", "make_candidate", "padded_length",
           "padding", "pin_reason", "restrict", "ring_choices", "sequence_chunks_ok", "sp_reason", "tile_ok"]
