"""Pinned knobs (``autosp-plan --fix KNOB=VALUE``): a team keeps its ZeRO stage, or prices the plan it runs today.

A pin names any field of :class:`~autosp.contract.specs.Candidate` (the plan's ``candidate`` section, read
from the dataclass, so a knob added there can be pinned without changes here) and a value written as in a plan
file: ``8``, ``true`` / ``false``, ``full`` (or ``"full"``). :func:`parse_pins` checks each pin on its own (the
field exists, the value has its type and passes the Candidate's own checks) and returns them as a sorted tuple of
``(name, value)`` pairs: the form :class:`~autosp.planner.request.PlanRequest` holds and the plan cache keys on.

:func:`autosp.planner.search.space.restrict` restricts a search space to the pins (the knob's choices become the pinned
value: a value the default search does not offer, e.g. ``micro_batch=16``, is searched too when the rules allow
it); :func:`check_pins` and :func:`empty_reason` say in one line why pins cannot hold. ``dp`` pins the SP degree (sp = world / dp); ``grad_accum`` is
checked against the global batch. A Candidate field the search space does not search yet can only be pinned to
its default.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields

from autosp.contract import rules
from autosp.contract.knobs import KNOBS
from autosp.contract.specs import Candidate
from autosp.errors import UsageError

DERIVED = tuple(knob.name for knob in KNOBS if not knob.searched)
"""Candidate fields that follow from others (dp = world / sp; grad_accum from the global batch)."""


def knob_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Candidate))


def _kind(name: str) -> type:
    """The type a pin of ``name`` takes: that of the field's default (``sp``, without a default, is an int)."""
    f = next(f for f in fields(Candidate) if f.name == name)
    return int if f.default is MISSING else type(f.default)


def _plain(value) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def format_pins(pins) -> str:
    return " ".join(f"{k}={_plain(v)}" for k, v in pins)


def parse_value(name: str, text) -> object:
    """``text`` (a string from the command line, or a value already) as the type of Candidate field ``name``."""
    kind = _kind(name)
    value = text
    if isinstance(text, str):
        raw = text.strip()
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw  # a bare string: full, kv_async
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
    if kind is bool:
        ok = isinstance(value, bool)
        what = "true or false"
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        what = "an integer"
    else:
        ok = isinstance(value, kind)
        what = f"a {kind.__name__}"
    if not ok:
        raise UsageError(f"--fix {name}={text}: {name} takes {what} (as in a plan file), got {text!r}")
    return value


def _check_alone(name: str, value) -> None:
    """The Candidate's own checks on one pinned value, with the other fields set so that they allow it (the knobs
    the rule table couples to it: :func:`autosp.contract.rules.witness`)."""
    base = dict(rules.witness({name: value}) if name in rules.NAMES else {}, sp=1)
    base[name] = value
    if name in ("ring", "ep") and isinstance(value, int) and value > 0:
        base["sp"] = value  # both must divide the SP x DP ranks
    try:
        Candidate(**base)
    except ValueError as err:
        raise UsageError(f"--fix {name}={_plain(value)}: {err}") from None


def parse_pins(pins) -> tuple[tuple[str, object], ...]:
    """``pins`` (``["zero_stage=3", ...]``, a dict, or (name, value) pairs) as a sorted tuple of pairs; a
    UsageError for an unknown knob, a malformed or invalid value, or a knob pinned twice to different values."""
    if pins is None:
        return ()
    if isinstance(pins, dict):
        items = list(pins.items())
    elif isinstance(pins, str):
        items = [pins]
    else:
        items = list(pins)
    out: dict[str, object] = {}
    names = knob_names()
    for item in items:
        if isinstance(item, str):
            name, sep, text = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or not name or not text.strip():
                raise UsageError(f"--fix takes KNOB=VALUE (e.g. --fix zero_stage=3), got {item!r}")
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
            name, text = item
        else:
            raise UsageError(f"--fix takes KNOB=VALUE (e.g. --fix zero_stage=3), got {item!r}")
        if name not in names:
            from difflib import get_close_matches

            near = get_close_matches(name, names, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise UsageError(f"--fix {name}: not a plan knob; {hint}knobs: {', '.join(names)}")
        value = parse_value(name, text)
        _check_alone(name, value)
        if name in out and out[name] != value:
            raise UsageError(f"--fix {name} is pinned twice: {_plain(out[name])} and {_plain(value)}")
        out[name] = value
    return tuple(sorted(out.items()))


def check_pins(space) -> None:
    """A UsageError, in one line, when a pin of ``space`` (a space built with ``fixed``) cannot hold on its model
    and cluster: an SP degree the cluster cannot place, a dp that does not divide the world, a knob the search
    does not search yet pinned away from its default, grad_accum without a global batch."""
    from autosp.planner.search.space import sp_reason

    hw = space.hardware
    pins = dict(space.fixed)
    if "dp" in pins and hw.world_size % pins["dp"]:
        raise UsageError(f"--fix dp={pins['dp']}: dp must divide the {hw.world_size} GPUs of {hw.name}")
    if "dp" in pins and "sp" in pins and pins["sp"] * pins["dp"] != hw.world_size:
        raise UsageError(f"--fix sp={pins['sp']} dp={pins['dp']}: sp x dp must be the {hw.world_size} GPUs of "
                         f"{hw.name}")
    sp = pins.get("sp", hw.world_size // pins["dp"] if "dp" in pins else None)
    if sp is not None:
        reason = sp_reason(space.model, hw, sp, space.allow_cross_node_sp)
        if reason:
            raise UsageError(f"--fix sp={sp}: {reason}")
    if pins.get("ep", 1) != 1:
        from autosp.planner.search.space import ep_reason

        reason = ep_reason(space.model, hw, pins["ep"])
        if reason:
            raise UsageError(f"--fix ep={pins['ep']}: {reason}")
    if pins.get("grad_accum", 1) != 1 and space.workload.global_batch is None:
        raise UsageError(f"--fix grad_accum={pins['grad_accum']} needs --global-batch (without it a step trains one "
                         "micro-batch per data-parallel replica)")
    gb = space.workload.global_batch
    if "grad_accum" in pins and gb is not None:
        accum = pins["grad_accum"]
        shares = sorted({dp * m for dp in (hw.world_size // s for s in space.sp) for m in space.micro_batch})
        if not any(gb == share * accum for share in shares):
            raise UsageError(f"--fix grad_accum={accum} cannot hold with --global-batch {gb}: the batch must be dp x "
                             f"micro_batch x grad_accum, and dp x micro_batch here is one of "
                             f"{', '.join(map(str, shares))} (so grad_accum divides {gb} into one of them)")
    _check_together(space, pins)
    for name, value in space.fixed:
        if name in space.KNOBS or name in DERIVED:
            continue
        default = next(f.default for f in fields(Candidate) if f.name == name)
        if value != default:
            raise UsageError(f"--fix {name}={_plain(value)}: the planner does not search {name} yet (the cost "
                             f"model does not price it); it can only be pinned to its default {_plain(default)}")


def _check_together(space, pins: dict) -> None:
    """All the pins at once (each alone passed :func:`parse_pins`): the rule table read both ways over the choices
    of the unpinned space (:func:`autosp.contract.rules.narrow`) must keep every pinned value and leave every knob a
    value, and the pinned layout must pass the Candidate's own checks; one line naming the contradiction
    (offload_param=true with zero_stage=2; offload_activations=true with checkpointing=none)."""
    from autosp.planner.search.space import build_space

    shown = format_pins(sorted(pins.items()))
    free = build_space(space.model, space.hardware, space.workload, space.allow_cross_node_sp, profile=space.profile)
    pinned = space.pinned()
    domains = {name: (pinned[name],) if name in pinned else values for name, values in free.choices().items()}
    _, conflicts = rules.narrow(domains, keep=set(pinned))
    if conflicts:
        raise UsageError(f"--fix {shown}: " + "; ".join(rule.why(value) for rule, value in conflicts[:2]))
    ring = pins.get("ring", 1)
    layout = {name: pins[name] for name in ("sp", "ring", *DERIVED) if name in pins}
    try:
        Candidate(**dict(layout, sp=pins.get("sp", ring)))  # the layout's own checks (ring divides sp)
    except ValueError as err:
        raise UsageError(f"--fix {shown}: {err}") from None


def empty_reason(space) -> str:
    """Why a pinned space has no valid candidate: the rule each SP layout the pins allow breaks."""
    from autosp.planner.search.space import divisors, invalid_reason, layout_reason, pin_reason

    pins = dict(space.fixed)
    hw = space.hardware
    empty = [name for name, values in space.choices().items() if not values]
    if empty:  # the pins (with what the canonical form couples to them) leave a knob no value
        return (f"--fix {format_pins(space.fixed)} leaves no valid plan: no {empty[0]} goes with "
                f"{'them' if len(pins) > 1 else 'it'}")
    sps = space.sp or tuple(divisors(hw.world_size))
    reasons = []
    for sp in sps:
        for ring in (space.ring if "ring" in pins else divisors(sp)):
            if layout_reason(space.model, hw, sp, ring, space.allow_cross_node_sp):
                continue
            knobs = {k: (pins[k] if k in pins else space.choices()[k][0]) for k in space.KNOBS}
            knobs.update(sp=sp, ring=ring)
            extra = {k: v for k, v in pins.items() if k not in knobs and k != "dp"}
            try:
                cand = Candidate(dp=hw.world_size // sp, **knobs, **extra)
            except ValueError as err:
                reasons.append(str(err))
                continue
            reason = invalid_reason(space.model, hw, space.workload, cand, space.allow_cross_node_sp) \
                or pin_reason(space.make(**knobs), space.fixed)
            if reason:
                reasons.append(reason)
    if not reasons and "ring" in pins:
        sp = sps[-1]
        reasons.append(layout_reason(space.model, hw, sp, pins["ring"], space.allow_cross_node_sp) or "")
    distinct = list(dict.fromkeys(r for r in reasons if r))
    why = "; ".join(distinct[:3]) if distinct else "the pinned values exclude each other"
    return f"--fix {format_pins(space.fixed)} leaves no valid plan: {why}"


__all__ = ["DERIVED", "check_pins", "empty_reason", "format_pins", "knob_names", "parse_pins", "parse_value"]
