"""The check's rows: which plan knobs, at which sequence lengths, in which order.

Every row is one compiled SP=1 training configuration of the same model. The order is the order of
value: the check stops at its time budget, so the rows that say most about the cost model come first
(a plain step, then long sequences, then one knob family after another). Across the rows every knob the
compiler accepts at SP=1 takes every value that matters (:func:`missing_knobs` checks it, and so does
tests/project/test_gpu_check.py). Adding a knob to the check is one line in :data:`ROWS` (the knob being a
:class:`~autosp.contract.specs.Candidate` field that :class:`studies.measure.RunConfig` mirrors).

``seq_len`` is the GPU length; the CPU dry run divides it by :data:`DRY_RUN_SEQ_DIVISOR`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autosp.contract.specs import CHECKPOINTING_POLICIES, Candidate, ModelSpec

__all__ = ["DRY_RUN_MODEL", "DRY_RUN_SEQ_DIVISOR", "GPU_MODEL", "KNOB_VALUES", "NOT_AT_SP1", "ROWS", "Row",
           "candidate_of", "compilable_knobs", "exercised", "missing_knobs", "row", "select"]

GPU_MODEL = "llama-3.2-1b"
"""The model preset (cost_models/catalog/models.toml) whose shape the GPU rows train, randomly initialised."""

DRY_RUN_MODEL = ModelSpec(name="tiny-llama-3.2-shape", n_layers=2, hidden=64, n_heads=8, n_kv_heads=2, head_dim=8,
                          ffn_hidden=256, vocab=512, tied_embeddings=True, rope_theta=500000.0)
"""Llama-3.2-1B's structure (grouped-query heads 4:1, tied embeddings, SwiGLU 4x) at a size that trains
in milliseconds on a CPU."""

DRY_RUN_SEQ_DIVISOR = 128


@dataclass(frozen=True)
class Row:
    name: str
    seq_len: int
    knobs: tuple  # (Candidate field, value) pairs; SP=1, everything else at its default

    def knob_dict(self) -> dict:
        return dict(self.knobs)


def row(name: str, seq_len: int, **knobs) -> Row:
    """One row; ``knobs`` are Candidate fields (validated here, so a typo fails at import)."""
    candidate_of(knobs)
    return Row(name=name, seq_len=seq_len, knobs=tuple(sorted(knobs.items())))


def candidate_of(knobs: dict) -> Candidate:
    return Candidate(sp=1, **knobs)


ROWS = (
    row("base-8k", 8192),                                                    # model states, activations, logits
    row("full-32k", 32768, checkpointing="full"),                            # long: attention, full recompute
    row("tiled-64k", 65536, zero_stage=2, checkpointing="full", mlp_chunks=4, loss_chunks=8),  # long-context recipe
    row("offload-32k", 32768, checkpointing="sequence", offload_activations=True),  # side-stream host copies
    row("chunks-64k", 65536, zero_stage=2, loss_chunks=8, sequence_chunks=4, offload_chunks=True),  # chunked layers
    row("selective-16k", 16384, zero_stage=1, checkpointing="selective", mlp_chunks=4),
    row("zero3-16k", 16384, zero_stage=3, checkpointing="sequence", mlp_chunks=2),  # no loss tiling: kept as the H200 sessions measured it
    row("optim-offload-8k", 8192, zero_stage=2, offload_optimizer=True, grad_accum=2),  # DeepSpeed CPU Adam
    row("param-offload-8k", 8192, zero_stage=3, checkpointing="full", offload_optimizer=True, offload_param=True),
    row("z3-optim-offload-8k", 8192, zero_stage=3, offload_optimizer=True),  # weights up via a cross-dtype copy
    row("micro-batch-4k", 4096, zero_stage=1, micro_batch=2),
)

# --- which knobs must be exercised ---------------------------------------------------------------------

NOT_AT_SP1 = {
    "sp": "the check runs SP=1 on one GPU",
    "dp": "data parallelism needs more than one GPU",
    "ring": "ring attention splits an SP group (needs sp > 1)",
    "overlap": "overlaps the Ulysses all-to-alls, and SP=1 has none (the planner fixes it at 'none')",
}
"""Candidate fields the check leaves at their defaults, and why."""

KNOB_VALUES = {"checkpointing": CHECKPOINTING_POLICIES, "zero_stage": (0, 1, 2, 3)}
"""Knobs whose every value must appear; any other knob must appear with one non-default value."""

# Settings that make a probe candidate valid when a knob depends on another (Candidate's own rules).
_ENABLERS = ({}, {"checkpointing": "full"}, {"zero_stage": 1}, {"zero_stage": 3}, {"sequence_chunks": 2})


def _probe_value(field: dataclasses.Field):
    if field.name in KNOB_VALUES:
        return [v for v in KNOB_VALUES[field.name] if v != field.default][0]
    return True if isinstance(field.default, bool) else 2


def compilable_knobs() -> dict:
    """{knob: required values} for every Candidate field the compiler builds at SP=1: asked of the
    compiler itself (``resolve_candidate`` refuses the knobs it cannot build yet), so a knob that becomes
    buildable becomes required here without editing this file."""
    from autosp.compiler.api import resolve_candidate
    from autosp.errors import UsageError

    out = {}
    for field in dataclasses.fields(Candidate):
        if field.name in NOT_AT_SP1:
            continue
        value = _probe_value(field)
        for enabler in _ENABLERS:
            try:
                cand = candidate_of({**enabler, field.name: value})
            except ValueError:
                continue
            try:
                resolve_candidate(cand)
            except UsageError:
                break  # refused: not buildable yet (or its enabler is not)
            out[field.name] = tuple(KNOB_VALUES.get(field.name, ("non-default",)))
            break
    return out


def exercised(rows) -> dict:
    """{knob: set of values} the rows use (defaults included for the multi-valued knobs)."""
    out: dict = {}
    for r in rows:
        cand = candidate_of(r.knob_dict())
        for field in dataclasses.fields(Candidate):
            if field.name in NOT_AT_SP1:
                continue
            value = getattr(cand, field.name)
            if field.name in KNOB_VALUES or value != field.default:
                out.setdefault(field.name, set()).add(value)
    return out


def missing_knobs(rows) -> dict:
    """{knob: values} the compiler accepts at SP=1 that no row exercises (empty when complete)."""
    seen = exercised(rows)
    missing = {}
    for knob, values in compilable_knobs().items():
        if values == ("non-default",):
            if not seen.get(knob):
                missing[knob] = values
        else:
            lacking = tuple(v for v in values if v not in seen.get(knob, set()))
            if lacking:
                missing[knob] = lacking
    return missing


def select(names: list[str] | None) -> list[Row]:
    """The rows named (in the order given), or all of them; unknown names raise ValueError."""
    if not names:
        return list(ROWS)
    by_name = {r.name: r for r in ROWS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown row(s) {', '.join(unknown)}; rows: {', '.join(by_name)}")
    return [by_name[n] for n in names]
