"""The knob table: every plan knob (a field of :class:`~autosp.contract.specs.Candidate`) described once.

A row says what the knob is (type, allowed values, default), how the planner treats it (structure or dial, its
memory-lean and fast values, its place in the simplicity and lean-first orders, searched or derived) and how it
is shown and written (the report's label and row, explain's short name, its key in the DeepSpeed config's
``autosp`` section). The searches, the diagnosis, the evaluator, explain, the report, the DeepSpeed config and
its reader, the search space and the study harness loop over :data:`KNOBS` instead of spelling the knobs out;
``tests/project/test_knob_table.py`` checks that the table has exactly Candidate's fields and that no module
outside it keeps a hand list of knob names. docs/design.md section 1 says how to add a knob.

The row order is the order of :data:`SEARCHED` (which Optuna suggests and the local moves visit in: changing it
changes which of two equally good plans a search meets first) and of the knob keys in the DeepSpeed config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

CHECKPOINTING_POLICIES = ("none", "selective", "sequence", "full")
"""Activation checkpointing, from most memory to least:

- ``none``: every activation the backward needs stays in memory.
- ``selective``: keep the outputs of matmuls, attention and collectives; recompute norms, RoPE,
  activations functions and other pointwise work in the backward.
- ``sequence``: keep the layer input, the attention inputs after their all-to-all and the attention
  output; recompute every O(s) operation (projections, MLP, norms). Attention (O(s^2)) and the
  collectives are never recomputed.
- ``full``: keep only each layer's input; recompute the whole layer, attention and collectives
  included.
"""

OVERLAP_SCHEDULES = ("none", "kv_async", "head_pipeline")
"""How the Ulysses all-to-alls overlap with compute:

- ``none``: each all-to-all runs when its input is ready and blocks.
- ``kv_async``: the K and V all-to-alls are launched asynchronously while Q's projection/all-to-all
  proceeds.
- ``head_pipeline``: attention runs in head chunks; the all-to-all of chunk i+1 overlaps the attention
  of chunk i.
"""

ZERO_STAGES = (0, 1, 2, 3)

MOST, LEAST = "most", "least"
"""Symbolic lean / fast values: the last (largest) or first (smallest) of the choices a search space offers."""

LAYOUT, STRUCTURE, DIAL, DERIVED = "layout", "structure", "dial", "derived"
"""Roles. ``layout``: where the tokens and process groups go (sp and its ring split). ``structure``: sets a
search family's shape (ZeRO stage, micro-batch, checkpointing, overlap). ``dial``: trades speed for memory
inside one structure; :func:`autosp.planner.search.moves.complete` chooses them for a structure. ``derived``: follows
from the layout and the batch (dp = world / sp, grad_accum from the global batch); never searched."""


def _on_off(on: str) -> Callable:
    return lambda value, cand: on if value else "off"


def _chunks(value: int, cand) -> str:
    return f"{value} chunk{'s' if value != 1 else ''}"


def _as_is(value, cand) -> str:
    return str(value)


def _sequence_chunks(value: int, cand) -> str:
    if value == 1:
        return "off (1)"
    kept = ("only their inputs kept, each layer re-run in its backward)" if cand.checkpointing == "full"
            else "kept whole: input, K/V and attention output per chunk)")
    return f"{value} per layer ({kept}"


@dataclass(frozen=True)
class Knob:
    """One plan knob. ``values`` empty: any positive integer (int knobs) or true/false (bool knobs)."""

    name: str
    kind: type
    default: object
    role: str
    values: tuple = ()
    label: str = ""
    """The report's row label ("" = shown inside a composite row: the layout, micro-batch x grad accum, experts)."""
    describe: Callable | None = None
    """The report's value text: ``describe(value, candidate)``."""
    report_row: int | None = None
    """Place of its row in the report's plan table (sp: the layout row, micro_batch: micro-batch x grad accum, both
    composed by the report); None: shown inside another row (dp, ring, grad_accum) or apart (ep)."""
    short: str = ""
    """explain's name when a runner-up differs in it ("" = not compared: dp follows sp, ep is priced apart)."""
    family: bool = False
    """Part of a search family's key (sp, ring, ZeRO stage, checkpointing): the searches sweep families, explain
    shows one runner-up per family."""
    lean: object = None
    """The memory-leanest value (a literal, or MOST / LEAST of the space's choices)."""
    fast: object = None
    """The fastest value inside one structure (dials): where the dial walk starts."""
    lean_both: bool = False
    """The lean points of a family try the fast end too: the lean value can lose elsewhere (offloads share the
    host's memory; expert parallelism adds dispatch buffers and an imbalance margin)."""
    memory_step: int = 0
    """Which way along its choices a single move saves device memory (+1: up, -1: down; a true/false knob: +1 when
    true saves it); 0: no single move of it only saves memory (the local moves leave it to the neighbourhood)."""
    simplicity: int | None = None
    """Place in the simplicity tie-break (:func:`autosp.planner.search.evaluator.simplicity`); None: not in it."""
    high_is_simpler: bool = False
    lean_rank: int | None = None
    """Place in the exhaustive max-ctx search's memory-lean-first order (higher values leaner); None: not in it."""
    lean_nest: int | None = None
    """Place in the nesting of a family's lean points (:func:`autosp.planner.search.fast._lean_points`, outermost first);
    None: the knob takes its lean value alone there."""
    ds_zero_key: str | None = None
    """Its key in DeepSpeed's own ``zero_optimization`` section (the offloads), which the reader falls back to."""
    ds_required: bool = False
    """Every autosp DeepSpeed config carries it (since the first): the reader refuses a config without it and
    coerces its value; the others default when missing (configs written before them) and are not coerced."""
    ds_key: str | None = None
    """Key in the ``autosp`` section of the DeepSpeed config (None: DeepSpeed's own keys carry it)."""

    @property
    def searched(self) -> bool:
        return self.role != DERIVED

    def order_key(self, value):
        """The value as a number that orders it (enumerated values by their index)."""
        return self.values.index(value) if self.values and self.kind is str else value


KNOBS: tuple[Knob, ...] = (
    Knob("sp", int, None, LAYOUT, short="sp", family=True, lean=MOST, simplicity=12, high_is_simpler=True, lean_rank=9,
         ds_key="sp", ds_required=True, report_row=0),
    Knob("ring", int, 1, LAYOUT, short="ring", family=True, simplicity=13, lean_rank=10, ds_key="ring"),
    Knob("dp", int, 1, DERIVED, ds_key="dp", ds_required=True),
    Knob("zero_stage", int, 0, STRUCTURE, ZERO_STAGES, "ZeRO stage", _as_is, short="ZeRO", family=True, memory_step=1, lean=MOST, simplicity=9,
         lean_rank=2, report_row=1),
    Knob("micro_batch", int, 1, STRUCTURE, short="micro-batch", memory_step=-1, lean=LEAST, simplicity=10, report_row=2),
    Knob("grad_accum", int, 1, DERIVED, short="grad-accum", simplicity=11),
    Knob("checkpointing", str, "none", STRUCTURE, CHECKPOINTING_POLICIES, "activation checkpointing", _as_is,
         short="ckpt", family=True, memory_step=1, lean="full", simplicity=4, lean_rank=3, ds_key="checkpointing", ds_required=True, report_row=3),
    Knob("mlp_chunks", int, 1, DIAL, (), "MLP tiling", _chunks, short="mlp chunks", memory_step=1, lean=MOST, fast=1,
         simplicity=6, lean_rank=7, ds_key="mlp_chunks", ds_required=True, report_row=4),
    Knob("loss_chunks", int, 1, DIAL, (), "logits+loss tiling", _chunks, short="loss chunks", memory_step=1, lean=MOST, fast=1,
         simplicity=7, lean_rank=8, ds_key="loss_chunks", ds_required=True, report_row=5),
    Knob("offload_activations", bool, False, DIAL, (), "activation offload",
         _on_off("on (checkpointed tensors to host memory)"), short="offload", memory_step=1, lean=True, fast=False, lean_both=True,
         simplicity=3, lean_rank=6, lean_nest=2, ds_key="offload_activations", ds_required=True, report_row=6),
    Knob("overlap", str, "none", STRUCTURE, OVERLAP_SCHEDULES, "all-to-all overlap", _as_is, short="overlap",
         lean="none", simplicity=8, lean_rank=11, ds_key="overlap", ds_required=True, report_row=9),
    Knob("offload_optimizer", bool, False, DIAL, (), "optimizer offload",
         _on_off("on (ZeRO-Offload: master weights, Adam states and step on the host; use DeepSpeed's CPU Adam)"),
         short="optimizer offload", memory_step=1, lean=True, fast=False, lean_both=True, simplicity=1, lean_rank=1, lean_nest=3,
         ds_key="offload_optimizer", ds_zero_key="offload_optimizer", report_row=10),
    Knob("sequence_chunks", int, 1, DIAL, (), "sequence chunks", _sequence_chunks, short="sequence chunks", memory_step=1, lean=MOST,
         fast=1, lean_both=True, simplicity=5, lean_rank=5, lean_nest=0, ds_key="sequence_chunks", report_row=7),
    Knob("offload_chunks", bool, False, DIAL, (), "chunk offload",
         _on_off("on (chunks' saved tensors and keys/values in pinned host memory)"), short="chunk offload",
         memory_step=1, lean=True, fast=False, lean_both=True, simplicity=2, lean_rank=4, lean_nest=1, ds_key="offload_chunks", report_row=8),
    Knob("offload_param", bool, False, DIAL, (), "parameter offload",
         _on_off("on (ZeRO-3 offload_param: bf16 weights on the host, fetched layer by layer)"),
         short="parameter offload", memory_step=1, lean=True, fast=False, lean_both=True, simplicity=0, lean_rank=0, lean_nest=4,
         ds_key="offload_param", ds_zero_key="offload_param", report_row=11),
    Knob("ep", int, 1, DIAL, lean=MOST, fast=LEAST, lean_both=True, lean_nest=5, ds_key="ep"),
)

BY_NAME = {knob.name: knob for knob in KNOBS}
SEARCHED = tuple(knob.name for knob in KNOBS if knob.searched)
"""The knobs a search space offers choices for (dp and grad_accum follow from sp and the batch)."""
DIALS = tuple(knob.name for knob in KNOBS if knob.role == DIAL)
"""The knobs that trade speed for memory within one structure; :func:`autosp.planner.search.moves.complete` sets them."""
STRUCTURAL = tuple(name for name in SEARCHED if name not in DIALS)
SIMPLICITY = tuple(sorted((k for k in KNOBS if k.simplicity is not None), key=lambda k: k.simplicity))
LEAN_FIRST = tuple(sorted((k for k in KNOBS if k.lean_rank is not None), key=lambda k: k.lean_rank))
REPORT_ROWS = tuple(sorted((k for k in KNOBS if k.report_row is not None), key=lambda k: k.report_row))
MEMORY_STEPS = tuple(k.name for k in KNOBS if k.memory_step and k.kind is not bool)
"""The counted and enumerated knobs a single move steps along to save memory (or back to spend it), table order."""
FAMILY = tuple(k.name for k in KNOBS if k.family)
"""The knobs of a search family's key, table order (sp, ring, ZeRO stage, checkpointing)."""
LEAN_NEST = tuple(k.name for k in sorted((k for k in KNOBS if k.lean_nest is not None), key=lambda k: k.lean_nest))


def pick(values: tuple, wanted):
    """The value ``wanted`` (a literal, MOST or LEAST) stands for among a space's ``values``: a literal the space
    does not offer gives way to its last choice (a pinned knob has one)."""
    if wanted is MOST:
        return values[-1]
    if wanted is LEAST:
        return values[0]
    return wanted if wanted in values else values[-1]


def lean_knobs(choices: dict, names=SEARCHED) -> dict:
    """Every knob of ``names`` at its memory-lean value among ``choices`` (knobs without a lean value skipped)."""
    return {n: pick(choices[n], BY_NAME[n].lean) for n in names if BY_NAME[n].lean is not None and n in choices}


def fast_dials(choices: dict | None = None) -> dict:
    """Every dial at its fastest value: the space's ``choices`` where given (its first choice where it lacks the
    fast value: a pinned dial), else the table's."""
    out = {}
    for name in DIALS:
        fast = BY_NAME[name].fast
        if choices is None or name not in choices:
            out[name] = BY_NAME[name].default if fast is LEAST else fast
        else:
            values = choices[name] or (BY_NAME[name].default,)
            out[name] = values[0] if fast is LEAST or fast not in values else fast
    return out


def lean_alternatives(name: str, values: tuple) -> tuple:
    """A dial's values for a family's lean points, leanest first: its lean value, and (``lean_both``) its fast
    end too; only values the space offers."""
    knob = BY_NAME[name]
    if knob.kind is bool:
        ends = (knob.lean, knob.fast) if knob.lean_both else (knob.lean,)
        return tuple(v for v in ends if v in values)
    ends = (pick(values, knob.lean),) + ((pick(values, knob.fast) if knob.fast is not None else values[0],)
                                         if knob.lean_both else ())
    return tuple(dict.fromkeys(ends))


def simplicity_key(cand) -> tuple:
    """Smaller is simpler: the knobs of :data:`SIMPLICITY` in their order."""
    return tuple(-k.order_key(getattr(cand, k.name)) if k.high_is_simpler else k.order_key(getattr(cand, k.name))
                 for k in SIMPLICITY)


def lean_first_key(cand) -> tuple:
    """Smaller is leaner (:data:`LEAN_FIRST`, every knob's larger value first)."""
    return tuple(-k.order_key(getattr(cand, k.name)) for k in LEAN_FIRST)


def family_of(cand) -> tuple:
    """``cand``'s search family: its values of :data:`FAMILY`."""
    return tuple(getattr(cand, name) for name in FAMILY)


def knobs_of(cand, names=SEARCHED) -> dict:
    """``cand``'s values of the knobs ``names`` (default: the searched ones), in table order."""
    return {name: getattr(cand, name) for name in names}


__all__ = ["BY_NAME", "CHECKPOINTING_POLICIES", "DERIVED", "DIAL", "DIALS", "FAMILY", "KNOBS", "LAYOUT", "LEAN_FIRST", "LEAST",
           "LEAN_NEST", "MEMORY_STEPS", "MOST", "OVERLAP_SCHEDULES", "REPORT_ROWS", "SEARCHED", "SIMPLICITY", "STRUCTURAL", "STRUCTURE", "ZERO_STAGES",
           "Knob", "family_of", "fast_dials", "knobs_of", "lean_alternatives", "lean_first_key", "lean_knobs", "pick",
           "simplicity_key"]
