"""What ``autosp-plan check`` and ``select`` read: a committed plan JSON or the DeepSpeed config
``autosp-plan --ds-config`` wrote, as one :class:`Artifact` (its knobs, the workload and target it was
made for, and the versions that made it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autosp.contract.knobs import KNOBS
from autosp.contract.specs import Candidate, Workload
from autosp.errors import UsageError


@dataclass
class Artifact:
    path: str
    kind: str  # "plan" | "deepspeed-config"
    candidate: Candidate
    workload: Workload
    objective: str
    model_name: str
    model_fingerprint: str | None
    hardware_name: str
    hardware_fingerprint: str | None
    versions: dict
    model: object = None      # ModelSpec (plans only)
    hardware: object = None   # HardwareSpec (plans only)
    estimate: object = None   # Estimate (plans only)
    search: dict = field(default_factory=dict)


def _read_json(path: str) -> dict:
    from autosp.files import read_json

    data = read_json(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def load_artifact(path: str) -> Artifact:
    data = _read_json(path)
    if "schema_version" in data and "candidate" in data:
        from autosp.contract.plan import plan_from_dict

        try:
            plan = plan_from_dict(data)
        except UsageError as err:
            raise UsageError(f"{path}: {err}") from None
        s = plan.search
        return Artifact(path=path, kind="plan", candidate=plan.candidate, workload=plan.workload,
                        objective=plan.objective, model_name=plan.model.name,
                        model_fingerprint=plan.model.fingerprint(), hardware_name=plan.hardware.name,
                        hardware_fingerprint=plan.hardware.fingerprint(),
                        versions={"autosp": plan.autosp_version, "space": s.get("space_version"),
                                  "cost_model": s.get("cost_model_version")},
                        model=plan.model, hardware=plan.hardware, estimate=plan.estimate, search=dict(s))
    if isinstance(data.get("autosp"), dict) and "train_micro_batch_size_per_gpu" in data:
        return _ds_artifact(path, data)
    raise UsageError(f"{path} is neither an autosp plan (autosp-plan --plan-out) nor a DeepSpeed config written "
                     "by autosp-plan --ds-config (it has no 'autosp' section)")


def _section_knobs(a: dict, zero: dict) -> dict:
    """The knobs of the ``autosp`` section (the knob table's ``ds_key`` column): those every config carried from the
    first are required and coerced, the later ones default when missing and are not coerced ("4" or "yes" are
    refused); an offload missing from the section is read from DeepSpeed's own zero_optimization."""
    out = {}
    for knob in KNOBS:
        if not knob.ds_key:
            continue
        if knob.ds_required:
            value = a[knob.ds_key]
            out[knob.name] = knob.kind(value) if knob.kind is not str else value
        elif knob.ds_zero_key:  # an offload DeepSpeed's zero_optimization carries too
            out[knob.name] = bool(a.get(knob.ds_key, (zero.get(knob.ds_zero_key) or {}).get("device", "none")
                                        not in ("none", None)))
        elif knob.ds_key in a:
            out[knob.name] = a[knob.ds_key]
    return out


def _ds_artifact(path: str, data: dict) -> Artifact:
    a = data["autosp"]
    zero = data.get("zero_optimization") or {}
    try:
        cand = Candidate(**_section_knobs(a, zero), zero_stage=int(zero.get("stage", 0)),
                         micro_batch=int(data["train_micro_batch_size_per_gpu"]),
                         grad_accum=int(data.get("gradient_accumulation_steps", 1)))
        dtype = a.get("dtype") or ("bf16" if (data.get("bf16") or {}).get("enabled") else "fp32")
        if "global_batch" in a:
            global_batch = a["global_batch"]
        else:  # configs written before it was recorded: a fixed batch only when it accumulates
            global_batch = a["sequences_per_step"] if cand.grad_accum > 1 else None
        workload = Workload(seq_len=int(a["seq_len"]), global_batch=global_batch, dtype=dtype,
                            doc_lens=a.get("doc_lens", ()), compile_backend=a.get("compile_backend", "inductor"))
    except KeyError as missing:
        raise UsageError(f"{path}: the DeepSpeed config's autosp section lacks {missing}") from None
    except (TypeError, ValueError) as bad:
        raise UsageError(f"{path}: invalid autosp section: {bad}") from None
    world = cand.sp * cand.dp
    if data.get("train_batch_size") not in (None, cand.micro_batch * cand.grad_accum * world):
        raise UsageError(f"{path}: train_batch_size {data['train_batch_size']} is not micro-batch x grad accum x "
                         f"dp x sp = {cand.micro_batch * cand.grad_accum * world}; the config was edited by hand")
    return Artifact(path=path, kind="deepspeed-config", candidate=cand, workload=workload,
                    objective=a.get("objective", "throughput"), model_name=a.get("model", "?"),
                    model_fingerprint=a.get("model_fingerprint"), hardware_name=a.get("hardware", "?"),
                    hardware_fingerprint=a.get("hardware_fingerprint"),
                    versions={"autosp": a.get("autosp_version"), "space": a.get("space_version"),
                              "cost_model": a.get("cost_model_version")},
                    search={"allow_cross_node_sp": a.get("allow_cross_node_sp")})


__all__ = ["Artifact", "load_artifact"]
