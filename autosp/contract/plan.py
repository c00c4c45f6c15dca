"""The plan: the planner's output and the compiler's input.

A plan is a versioned JSON document. Its ``candidate`` holds every knob the compiler applies, under the
same names as :class:`autosp.contract.specs.Candidate`; the rest is the evidence that justified it
(model, hardware, workload, prediction, search) and what makes it reusable (versions, fingerprints).

Schema (``schema_version`` 2)::

    {
      "schema_version": 2,
      "autosp_version": "0.1.0",
      "created_at": "2026-12-02T12:00:00+00:00",
      "objective": "throughput" | "max-ctx",
      "model": {ModelSpec fields},
      "parameters": {"total", "active_per_token"},
      "hardware": {HardwareSpec fields, "accelerator": {AcceleratorSpec fields}},
      "workload": {Workload fields},
      "candidate": {Candidate fields},
      "estimate": {"memory": {MemoryBreakdown fields}, "time": {TimeBreakdown fields},
                   "capacity_bytes", "tokens_per_second", "mfu", "flops_per_step", "notes"},
      "search": {free-form facts about the search: sampler, trials, evaluations, wall time, ...},
      "runner_ups": [{"candidate": {...}, "estimate": {...}, "lost_because": "..."}]
    }

``parameters`` is derived from ``model`` (:meth:`ModelSpec.n_params`: all of them, and those one token uses,
fewer for a mixture of experts) for people reading the file; readers recompute it, so plans written before it
read as they did. Readers reject a newer ``schema_version`` than they know, unknown fields and missing fields
with a one-line error. Version history: 2 added the candidate fields ``ring``, ``sequence_chunks``,
``offload_chunks`` and ``offload_param``; a version-1 plan reads as version 2 with their defaults
(pure Ulysses, unchunked layers, no chunk or parameter offload), which is what it ran.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from autosp.contract.specs import (
    Candidate,
    Estimate,
    HardwareSpec,
    MemoryBreakdown,
    ModelSpec,
    TimeBreakdown,
    Workload,
    from_dict,
    hardware_from_dict,
)
from autosp.errors import UsageError
from autosp.files import read_json, write_text
from autosp.version import __version__

SCHEMA_VERSION = 2
OBJECTIVES = ("throughput", "max-ctx")


@dataclass(frozen=True)
class RunnerUp:
    candidate: Candidate
    estimate: Estimate
    lost_because: str


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    hardware: HardwareSpec
    workload: Workload
    candidate: Candidate
    estimate: Estimate
    objective: str = "throughput"
    search: dict = field(default_factory=dict)
    runner_ups: tuple[RunnerUp, ...] = ()
    autosp_version: str = __version__
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        data = {}
        for name, value in asdict(self).items():
            data[name] = value
            if name == "model":
                data["parameters"] = parameter_counts(self.model)
        data["runner_ups"] = [asdict(r) for r in self.runner_ups]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"


def parameter_counts(model: ModelSpec) -> dict:
    """The plan's ``parameters`` section: the model's parameter count, and the part one token uses."""
    return {"total": model.n_params(), "active_per_token": model.n_params(active=True)}


def estimate_from_dict(data: dict) -> Estimate:
    data = dict(data)
    data["memory"] = from_dict(MemoryBreakdown, data["memory"])
    data["time"] = from_dict(TimeBreakdown, data["time"])
    data["notes"] = tuple(data.get("notes", ()))
    return from_dict(Estimate, data)


def plan_from_dict(data: dict) -> Plan:
    """Rebuild a :class:`Plan`; raises :class:`UsageError` with one line on any schema problem."""
    if not isinstance(data, dict):
        raise UsageError("plan must be a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise UsageError("plan has no integer schema_version; is this an autosp plan file?")
    if version > SCHEMA_VERSION:
        raise UsageError(f"plan schema_version {version} is newer than this autosp understands "
                         f"({SCHEMA_VERSION}); upgrade autosp")
    try:
        runner_ups = tuple(
            RunnerUp(from_dict(Candidate, r["candidate"]), estimate_from_dict(r["estimate"]), r["lost_because"])
            for r in data.get("runner_ups", ()))
        plan = Plan(
            model=from_dict(ModelSpec, data["model"]),
            hardware=hardware_from_dict(data["hardware"]),
            workload=from_dict(Workload, data["workload"]),
            candidate=from_dict(Candidate, data["candidate"]),
            estimate=estimate_from_dict(data["estimate"]),
            objective=data.get("objective", "throughput"),
            search=dict(data.get("search", {})),
            runner_ups=runner_ups,
            autosp_version=data.get("autosp_version", "unknown"),
            created_at=data.get("created_at", ""),
            schema_version=version,
        )
    except KeyError as missing:
        raise UsageError(f"plan is missing field {missing}") from None
    except (TypeError, ValueError) as bad:
        raise UsageError(f"invalid plan: {bad}") from None
    if plan.objective not in OBJECTIVES:
        raise UsageError(f"invalid plan: objective must be one of {OBJECTIVES}, got {plan.objective!r}")
    return plan


def load_plan(path: str | os.PathLike) -> Plan:
    return plan_from_dict(read_json(path, "plan "))


def save_plan(plan: Plan, path: str | os.PathLike, flag: str = "") -> None:
    """Write ``plan`` to ``path`` atomically, only ever replacing a regular file (:func:`autosp.files.write_text`;
    ``flag`` names the option that asked for it in errors)."""
    write_text(path, plan.to_json(), flag)


__all__ = ["OBJECTIVES", "SCHEMA_VERSION", "Plan", "RunnerUp", "estimate_from_dict", "load_plan", "parameter_counts",
           "plan_from_dict", "save_plan"]
