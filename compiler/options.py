"""How ``autosp.compile`` runs a plan: :class:`CompileOptions`, the one options object of
``autosp.compile(model, plan, *, sp_size=None, options=None)``.

A plan (a plan file, a Plan or a :class:`~autosp.contract.specs.Candidate`) says *what* runs: every parallelism and
memory knob. The options say everything else: the optimizer and its schedule, the precision, the torch.compile
backend, DeepSpeed overrides, the data conventions. The two never overlap, so a knob has one spelling (the
Candidate's field) and the planner's plan and a hand-made one compile alike.

Imports no torch: ``autosp.CompileOptions`` is built before anything heavy is loaded, and a bad value is one line
(:class:`~autosp.errors.UsageError`) before a process group or a model is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from autosp.compiler.training.schedule import OptimizerOptions
from autosp.contract.specs import DTYPES, Candidate
from autosp.errors import UsageError

BACKENDS = ("inductor", "aot_eager")
"""The torch.compile backends autosp's passes run under (``aot_eager``: no Inductor codegen, for tests)."""


@dataclass(frozen=True)
class CompileOptions:
    """The run options of :func:`autosp.compile`; every field has a default, so ``CompileOptions()`` is a plain run.
    Checked when built (one :class:`~autosp.errors.UsageError` line per bad value)."""

    optimizer: object = None
    """A ``torch.optim.Optimizer`` over ``model.parameters()``, a callable ``params -> optimizer`` (needed with
    ``ep > 1``: autosp builds it over the parameters each rank keeps), or None: DeepSpeed's ``optimizer`` section of
    ``ds_config`` if there is one, else AdamW as ``optim`` says (a torch optimizer: no CUDA extension build)."""
    optim: OptimizerOptions | None = None
    """The default AdamW's learning rate and weight decay, and (unless ``lr_scheduler`` is given) its learning-rate
    schedule: :class:`autosp.OptimizerOptions`. None: ``OptimizerOptions()`` (lr 1e-4) and no schedule."""
    lr_scheduler: object = None
    """A torch LR scheduler, or a callable ``optimizer -> scheduler``; handed to DeepSpeed, which steps it at every
    optimizer step and saves it in its checkpoints."""
    dtype: str | None = None
    """``"fp32"`` or ``"bf16"`` (DeepSpeed bf16: bf16 weights, fp32 master weights); None: the plan's, else fp32."""
    backend: str = "inductor"
    """The torch.compile backend: ``"inductor"`` or ``"aot_eager"`` (no code generation; what the tests use)."""
    ds_config: dict | None = None
    """DeepSpeed config entries merged over the generated one (:func:`autosp.contract.deepspeed_config.
    deepspeed_config`, the same one ``autosp-plan --ds-config`` writes)."""
    gradient_clipping: float | None = None
    """The maximum global gradient norm; None: 1.0 (:data:`autosp.contract.deepspeed_config.GRADIENT_CLIPPING`);
    0 turns clipping off."""
    ignore_index: int = -100
    """The label that takes no part in the loss (``F.cross_entropy``'s default)."""
    pad_token_id: int | None = None
    """The token that pads S to a multiple of the SP degree (pads are masked by causality and their labels ignored);
    None: the model config's ``pad_token_id``, else 0."""
    pad_to_multiple_of: int = 1
    """Also pad S to a multiple of this: bounds how many distinct lengths are compiled (one graph each)."""
    dist_backend: str | None = None
    """The process-group backend when torch.distributed is not initialised yet; None: nccl on CUDA, else gloo."""
    z3_leaf_modules: tuple[str, ...] | None = None
    """ZeRO-3 only: the names of the modules gathered as one unit and traced as one graph; None: the children of
    every ``nn.ModuleList`` (the decoder layers)."""
    packed: bool = False
    """The batches hold packed documents (``position_ids`` restarting at 0, or ``seq_lens`` / ``cu_seq_lens``): compile
    attention restricted to documents. Not needed when the first batch is packed or the model has sliding-window
    layers (read from its config)."""

    def __post_init__(self):
        if self.optimizer is not None and not (callable(self.optimizer) or hasattr(self.optimizer, "param_groups")):
            raise UsageError(f"optimizer must be a torch optimizer or a callable params -> optimizer, "
                             f"got {type(self.optimizer).__name__}")
        if self.optim is not None and not isinstance(self.optim, OptimizerOptions):
            raise UsageError(f"optim must be an autosp.OptimizerOptions, got {type(self.optim).__name__}")
        if self.lr_scheduler is not None and not (callable(self.lr_scheduler) or hasattr(self.lr_scheduler, "step")):
            raise UsageError(f"lr_scheduler must be a torch LR scheduler or a callable optimizer -> scheduler, "
                             f"got {type(self.lr_scheduler).__name__}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.backend not in BACKENDS:
            raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.ds_config is not None and not isinstance(self.ds_config, dict):
            raise UsageError(f"ds_config must be a dict of DeepSpeed config entries, "
                             f"got {type(self.ds_config).__name__}")
        clip = self.gradient_clipping
        if clip is not None and (not _is_number(clip) or not math.isfinite(clip) or clip < 0):
            raise UsageError(f"gradient_clipping must be a number >= 0 (0 turns clipping off), got {clip!r}")
        if not _is_int(self.ignore_index):
            raise UsageError(f"ignore_index must be an integer, got {self.ignore_index!r}")
        if self.pad_token_id is not None and not (_is_int(self.pad_token_id) and self.pad_token_id >= 0):
            raise UsageError(f"pad_token_id must be a token id >= 0, got {self.pad_token_id!r}")
        if not (_is_int(self.pad_to_multiple_of) and self.pad_to_multiple_of >= 1):
            raise UsageError(f"pad_to_multiple_of must be a positive integer, got {self.pad_to_multiple_of!r}")
        if self.dist_backend is not None and not (isinstance(self.dist_backend, str) and self.dist_backend):
            raise UsageError(f"dist_backend must be a torch.distributed backend name such as 'gloo' or 'nccl', "
                             f"got {self.dist_backend!r}")
        leaves = self.z3_leaf_modules
        if leaves is not None:
            if isinstance(leaves, str) or not all(isinstance(name, str) for name in _iterable(leaves)):
                raise UsageError(f"z3_leaf_modules must be a list of module names, got {leaves!r}")
            object.__setattr__(self, "z3_leaf_modules", tuple(leaves))  # frozen: a caller's list cannot change it
        if not isinstance(self.packed, bool):
            raise UsageError(f"packed must be true or false, got {self.packed!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _iterable(value):
    try:
        return list(value)
    except TypeError:
        return [None]  # not a list: refused by the caller's check


RENAMED_KNOBS = {"ring_size": "ring", "dp_size": "dp", "ep_size": "ep"}
"""autosp.compile's former keywords for three Candidate fields (the rest had the field's own name)."""


def old_keywords_message(keywords: dict, plan=None, sp_size=None) -> str:
    """The one line for ``autosp.compile(..., **keywords)`` with keywords it no longer takes: which of them are plan
    knobs (a Candidate's fields, under their former names too) and which are options (:class:`CompileOptions`'
    fields, or :class:`OptimizerOptions`' for the learning rate and its schedule), each with the call to write."""
    knob_fields = {f.name for f in fields(Candidate)}
    option_fields = {f.name for f in fields(CompileOptions)}
    optim_fields = {f.name for f in fields(OptimizerOptions)}
    knobs, options, optim, unknown = {}, {}, {}, []
    for name, value in keywords.items():
        field = RENAMED_KNOBS.get(name, name)
        if field in knob_fields:
            knobs[field] = value
        elif name in option_fields:
            options[name] = value
        elif name in optim_fields:
            optim[name] = value
        else:
            unknown.append(name)
    parts = []
    if knobs:
        what = _named(keywords, lambda n: RENAMED_KNOBS.get(n, n) in knob_fields, "a plan knob", "plan knobs")
        if plan is not None:
            held = ("plan" if isinstance(plan, Candidate) else "plan.candidate" if hasattr(plan, "candidate")
                    else f"autosp.load_plan({_shown(str(plan))}).candidate")
            parts.append(f"{what}, which the plan carries: to change {'it' if len(knobs) == 1 else 'them'}, pass "
                         f"plan=dataclasses.replace({held}, {_arguments(knobs)})")
        else:
            sp = knobs.pop("sp", sp_size)
            knobs = {"sp": _Call("N") if sp is None else sp, **knobs}
            instead = " in place of sp_size=" if sp_size is not None else ""
            hint = "" if "dp" in knobs else f" (add dp= if more than {_shown(knobs['sp'])} processes run)"
            parts.append(f"{what}: pass plan=autosp.Candidate({_arguments(knobs)}){instead}{hint}")
    if options or optim:
        if optim:
            options["optim"] = _Call(f"autosp.OptimizerOptions({_arguments(optim)})")
        what = _named(keywords, lambda n: n in option_fields or n in optim_fields, "an option", "options")
        parts.append(f"{what}: pass options=autosp.CompileOptions({_arguments(options)})")
    if unknown:
        names = ", ".join(f"{n}=" for n in unknown)
        parts.append(f"autosp.compile has no {names}: it takes the model, plan= (or sp_size=) and options=")
    return "; ".join(parts)


class _Call(str):
    """Source text shown as is (not quoted) in a suggested call."""

    def __repr__(self) -> str:
        return str(self)


def _arguments(values: dict) -> str:
    return ", ".join(f"{name}={_shown(value)}" for name, value in values.items())


def _shown(value) -> str:
    """A value as the user would type it, where it is a short literal; ``...`` for objects and long literals."""
    if isinstance(value, _Call):
        return str(value)
    text = repr(value) if value is None or isinstance(value, (bool, int, float, str)) else "..."
    return text if len(text) <= 40 else "..."


def _named(keywords: dict, keep, one: str, several: str) -> str:
    names = [f"{name}=" for name in keywords if keep(name)]
    return f"{', '.join(names)} {'is ' + one if len(names) == 1 else 'are ' + several}"


__all__ = ["BACKENDS", "CompileOptions", "RENAMED_KNOBS", "old_keywords_message"]
