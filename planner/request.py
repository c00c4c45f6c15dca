"""One planning request: :class:`PlanRequest`, the question every planning entry point asks.

``autosp.plan(...)``, ``autosp-plan``, ``autosp-plan check`` / ``select`` (the target a committed plan is
re-priced on, and the search for the best plan now) and the plan cache key all take this one frozen
dataclass, so a request means the same thing wherever it is made. It holds what the user said (a preset
name or a ModelSpec, ``"200k"`` or 200000, ...), normalised and validated when it is built: a bad value
is a one-line :class:`~autosp.errors.UsageError` naming the command-line flag.

:func:`resolve` turns it into a :class:`ResolvedRequest`: the ModelSpec (and the graph profile of a
model that is not a preset), the HardwareSpec and the Workload the cost model prices.
:meth:`ResolvedRequest.key_material` is everything the answer depends on, the plan cache's key.

Adding a kind of request (a knob the user pins, a workload of packed documents, ...): add a field with a
default that means "as before", validate it in ``__post_init__``, use it where the search or the cost
model needs it, and give ``autosp-plan`` a flag that sets it. It enters the cache key by itself:
:meth:`ResolvedRequest.key_material` lists every field. Commands that plan many requests (a sweep over
context lengths) derive them with ``dataclasses.replace(request, ctx=...)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from autosp.contract.specs import COMPILE_BACKENDS, DTYPES, HardwareSpec, ModelSpec, Workload, workload_key
from autosp.errors import UsageError
from autosp.contract.plan import OBJECTIVES
from autosp.planner.search.limits import CTX_GRANULE, DEFAULT_TRIALS, MAX_TRIALS
from autosp.units import check_seed, parse_count, parse_ctx, parse_seconds

SEARCHES = ("optuna", "exhaustive", "fast")

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class PlanRequest:
    """What to train, where, for what, and how hard to search. Build it with the values a user types or
    their parsed forms; the fields hold the parsed forms."""

    model: object
    """A preset name, a Hugging Face ``config.json`` path, a ``package.module:function`` model factory, a
    ModelSpec, or a :class:`~autosp.cost_models.profile.ModelProfile`."""
    hw: object
    """A catalog name (``h100x8``), a cluster file (.toml, or a calibrated .json), or a HardwareSpec."""
    ctx: int | None = None
    """Tokens per sequence (``"200k"``, 131072). None only with ``objective="max-ctx"``, where a value is
    the least context the plan must reach."""
    nodes: int | None = None
    """Overrides the node count of ``hw``."""
    objective: str = "throughput"
    """``throughput`` (most tokens/s at ``ctx``) or ``max-ctx`` (the longest context that fits)."""
    global_batch: int | None = None
    """Sequences per optimizer step; None: one micro-batch per data-parallel replica."""
    dtype: str = "bf16"
    allow_cross_node_sp: bool = True
    """SP groups may span nodes (their all-to-alls or ring steps then use the inter-node links); False keeps
    every SP group inside one node (``--no-cross-node-sp``)."""
    search: str = "optuna"
    """``optuna`` (which scores a small space whole), ``exhaustive``, or ``fast`` (no sampler: branch and bound
    over the structure families, :mod:`autosp.planner.search.fast`; the default of ``autosp-plan sweep``)."""
    trials: int | None = None
    """Optuna trials; None: 60, or as many as ``time_budget`` allows; 0 only with a shared study."""
    seed: int = 0
    time_budget: float | None = None
    """Seconds the Optuna trials may take (``"2m"``)."""
    top_k: int = 3
    """Runner-ups to explain."""
    fix: tuple = ()
    """Pinned knobs (``--fix KNOB=VALUE``): ``["zero_stage=3", "checkpointing=full"]``, a dict or (name, value)
    pairs of :class:`~autosp.contract.specs.Candidate` fields; held as sorted (name, value) pairs
    (:mod:`autosp.planner.pins`). The search explores only plans that keep them."""
    doc_lens: object = None
    """Packed documents: a ``--doc-lens`` file (text lengths, JSON list, or JSON {length: count}), a list of
    lengths, a {length: count} mapping or (length, count) pairs; held as ((length, count), ...)
    (planner/doc_lens.py). None: unpacked, every sequence one document."""
    mean_doc_len: object = None
    """Packed documents all of this many tokens (``"16k"``); excludes ``doc_lens``."""
    attention_kernel: str | None = None
    """The attention kernel the cost model prices (``flash2``, ``flash3``, ``cudnn``, ``flex``); None: the one the
    compiler runs on the accelerator (cost_models/catalog/attention_kernels.py)."""
    compile_backend: str = "inductor"
    """How the step will be compiled (``autosp-train --backend``): ``inductor`` or ``aot_eager``, or ``eager``
    for a step that is not compiled; only an untiled loss costs differently (``Workload.compile_backend``)."""

    def __post_init__(self):
        def set_(name, value):
            object.__setattr__(self, name, value)

        from autosp.cost_models.profile import ModelProfile

        if not (isinstance(self.model, (ModelSpec, ModelProfile)) or (isinstance(self.model, str) and self.model.strip())):
            raise UsageError(f"--model must be a preset name, a path to a config.json or package.module:function, "
                             f"got {self.model!r}")
        if isinstance(self.hw, str):
            if not self.hw.strip():
                raise UsageError(f"--hw must be a catalog name such as h100x8 or a path to a cluster file, "
                                 f"got {self.hw!r}")
        elif not isinstance(self.hw, HardwareSpec):
            raise UsageError(f"--hw must be a catalog name such as h100x8 or a path to a cluster file, got {self.hw!r}")
        from autosp.cost_models.catalog.attention_kernels import KERNELS

        if self.attention_kernel is not None and self.attention_kernel not in KERNELS:
            raise UsageError(f"--attention-kernel must be one of {', '.join(KERNELS)}, got {self.attention_kernel!r}")
        for name, allowed in (("objective", OBJECTIVES), ("search", SEARCHES), ("dtype", DTYPES),
                              ("compile_backend", COMPILE_BACKENDS)):
            if getattr(self, name) not in allowed:
                raise UsageError(f"{_flag(name)} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.ctx is None:
            if self.objective != "max-ctx":
                raise UsageError("--ctx is required (except with --objective max-ctx)")
        else:
            set_("ctx", parse_ctx(self.ctx))
        for name in ("nodes", "global_batch"):
            if getattr(self, name) is not None:
                set_(name, parse_count(getattr(self, name), _flag(name)))
        if not isinstance(self.allow_cross_node_sp, bool):
            raise UsageError(f"allow_cross_node_sp must be True or False, got {self.allow_cross_node_sp!r}")
        if self.trials is not None:
            trials = 0 if str(self.trials).strip() == "0" and not isinstance(self.trials, bool) \
                else parse_count(self.trials, "--trials")
            if trials > MAX_TRIALS:
                raise UsageError(f"--trials {trials:,} is more than one search runs (at most {MAX_TRIALS:,}: each "
                                 f"TPE trial costs more than the last); bound a longer search by time with "
                                 f"--time-budget")
            set_("trials", trials)
        check_seed(self.seed)
        if self.time_budget is not None:
            set_("time_budget", parse_seconds(self.time_budget, "--time-budget"))
            if self.search != "optuna":
                raise UsageError("--time-budget bounds the Optuna search; --search exhaustive scores every candidate")
        from autosp.planner.pins import parse_pins

        set_("fix", parse_pins(self.fix))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise UsageError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if self.doc_lens is not None or self.mean_doc_len is not None:
            from autosp.planner import doc_lens as docs

            if self.doc_lens is not None and self.mean_doc_len is not None:
                raise UsageError("give --doc-lens or --mean-doc-len, not both: --mean-doc-len N stands for documents "
                                 "all N tokens long, --doc-lens FILE for the real lengths")
            if self.mean_doc_len is not None:
                set_("mean_doc_len", docs.mean_histogram(self.mean_doc_len)[0][0])
            elif isinstance(self.doc_lens, (str, os.PathLike)):
                set_("doc_lens", docs.read_doc_lens(self.doc_lens))
            else:
                set_("doc_lens", docs.histogram_of(self.doc_lens))

    def documents(self) -> tuple:
        """The packed-document histogram ((length, count), ...) the workload carries; () when unpacked."""
        if self.mean_doc_len is not None:
            return ((self.mean_doc_len, 1),)
        return self.doc_lens or ()

    def effective_trials(self, shared: bool = False) -> int:
        """The Optuna trials this request runs: ``trials``, else as many as the time budget allows (at most
        MAX_TRIALS), else the default; 0 (read a shared study as it is) only for a shared study."""
        if self.trials == 0 and not shared:
            raise UsageError("--trials must be positive, got 0 (--trials 0 reads a shared study: it needs --storage)")
        if self.trials is not None:
            return self.trials
        return MAX_TRIALS if self.time_budget is not None else DEFAULT_TRIALS

    def model_label(self) -> str:
        """The model as the user named it (a ModelSpec or ModelProfile: its name)."""
        return self.model if isinstance(self.model, str) else self.model.name

    def hardware_label(self) -> str:
        return self.hw if isinstance(self.hw, str) else self.hw.name


@dataclass(frozen=True)
class ResolvedRequest:
    """A request with its specs: what the cost model prices."""

    request: PlanRequest
    model: ModelSpec
    profile: object  # the graph-derived ModelProfile of a model that is not a preset, else None
    hardware: HardwareSpec
    workload: Workload  # seq_len: the request's ctx (max-ctx without one: the search granule)

    def key_material(self, trials: int, space_version: str) -> dict:
        """Everything the answer depends on (the plan cache's key and a shared study's binding): each field
        of the request, the model and the hardware by fingerprint, with the effective ``trials``; the
        search settings only where they matter (Optuna)."""
        r = self.request
        optuna = r.search == "optuna"
        workload = dict(workload_key(self.workload), seq_len=r.ctx)  # None: max-ctx without a floor
        out = {"model": self.model.fingerprint(), "hardware": self.hardware.fingerprint(), "workload": workload}
        folded = {"model", "hw", "nodes", "ctx", "global_batch", "dtype", "compile_backend"}
        for f in fields(PlanRequest):
            if f.name not in folded:
                out[f.name] = getattr(r, f.name)
        out.update(trials=trials if optuna else None, seed=r.seed if optuna else None,
                   time_budget=r.time_budget if optuna else None, space_version=space_version)
        if self.profile is not None:
            out["model_profile"] = self.profile.fingerprint  # graph-derived costs: the plan depends on the trace
        return out


def resolve_hardware(hw, nodes=None) -> HardwareSpec:
    """A HardwareSpec from a catalog name, a cluster file or a HardwareSpec, with ``nodes`` nodes."""
    if nodes is not None:
        nodes = parse_count(nodes, "--nodes")
    if isinstance(hw, HardwareSpec):
        from autosp.cost_models.catalog.hardware_checks import validate_hardware, with_nodes

        where = f"hardware {hw.name!r}"
        return validate_hardware(hw if nodes is None else with_nodes(hw, nodes, where), where)
    from autosp.cost_models.catalog.hardware import resolve_hardware as from_catalog

    return from_catalog(hw, nodes=nodes)


def resolve(request: PlanRequest) -> ResolvedRequest:
    """The specs of ``request`` (reads the catalogs; a model that is not a preset is priced by its graph
    profile, traced once and cached: :mod:`autosp.planner.profiles`)."""
    from autosp.planner.profiles import resolve_model_and_profile

    model, profile = resolve_model_and_profile(request.model)
    hardware = resolve_hardware(request.hw, request.nodes)
    if request.attention_kernel is not None:
        from autosp.cost_models.catalog.attention_kernels import with_kernel

        try:
            hardware = with_kernel(hardware, request.attention_kernel)
        except ValueError as err:
            raise UsageError(f"--attention-kernel: {err}") from None
    workload = Workload(seq_len=request.ctx or CTX_GRANULE, global_batch=request.global_batch, dtype=request.dtype,
                        doc_lens=request.documents(), compile_backend=request.compile_backend)
    return ResolvedRequest(request=request, model=model, profile=profile, hardware=hardware, workload=workload)


__all__ = ["SEARCHES", "PlanRequest", "ResolvedRequest", "resolve", "resolve_hardware"]
