"""Which cost profile prices a ``--model``: the analytic one for presets, a graph-derived one otherwise.

- A preset name (or a :class:`ModelSpec`) is priced by the hand-derived formulas of docs/cost_model.md
  (``analytic_profile``), exactly as before: planning a preset never imports torch.
- A Hugging Face ``config.json`` (a file or a directory holding one) or an ``nn.Module`` factory
  ``package.module:function`` is priced by its graph profile
  (:func:`autosp.profiling.graph.load_or_build`, docs/graph_profile.md): the model is traced
  once under FakeTensorMode (seconds, with progress on stderr) and the profile is cached per model
  fingerprint, so the next plan for the same model reads one JSON file and does not import torch.
  The plan's ModelSpec is ``profile.model_spec()`` (the traced widths); for a config.json the fields a
  trace cannot see (norm kind, RoPE theta, max positions, sliding windows: the trace runs every layer as
  full causal attention, the cost model applies the window) come from the config itself.

A mixture-of-experts config (routing is data-dependent), a soft-capped Gemma 2 config and a Gated DeltaNet hybrid
(Qwen3-Next, Qwen3.5: a trace would record transformers' torch fallback of the recurrence, which autosp replaces with
its own op, compiler/linear_attention.py) are priced by the formulas directly (cost_models/moe.py, softcap.py,
linear_attention.py), without a trace; the plan's model source says so.

If tracing a config.json fails, :mod:`autosp.planner.profile_fallback` decides in one stderr line: a
model autosp-train cannot train (transformers cannot build it, or its attention is not SDPA) is refused;
otherwise the plan is priced with the analytic formulas for the config's widths when they count the
model's parameters, and the fallback is recorded in the plan. An entry point has no such fallback and
fails with a usage error.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from autosp.cost_models.profile import ModelProfile
from autosp.contract.specs import ModelSpec
from autosp.errors import UsageError
from autosp.messages import one_line


TRACE_SECONDS = 15
"""What the first plan of a config costs on top of the search, said before it starts: 15-22 s on 2 CPU cores
(issue 19, item 12), most of it importing torch and transformers."""


def _is_entry_point(arg: str) -> bool:
    module, sep, attr = arg.partition(":")
    return bool(sep and module and attr and all(p.isidentifier() for p in module.split(".") + attr.split(".")))


def _say(message: str) -> None:
    print(f"autosp-plan: {one_line(message)}", file=sys.stderr, flush=True)


def _load(arg: str) -> ModelProfile:
    from autosp.profiling import graph as graph_profile

    key = graph_profile.fingerprint(arg)
    if graph_profile.read_cached(key) is None:
        what = "config" if arg.endswith(".json") or not _is_entry_point(arg) else "model"
        _say(f"{arg} is not a preset: tracing this {what} once: ~{TRACE_SECONDS} s (torch and transformers load, "
             f"then the trace; its cost profile is then cached as {graph_profile.cache_path(key)}) ...")
    return graph_profile.load_or_build(arg)


def _analytic_reason(spec: ModelSpec) -> str | None:
    """Why a config.json is priced by the formulas without tracing, or None. A mixture of experts routes tokens
    by data (a fake-tensor trace cannot follow the per-expert token counts); Gemma 2's soft-capped attention runs
    outside SDPA in transformers. Both are what the formulas describe (cost_models/moe.py, softcap.py)."""
    if spec.n_experts:
        return "mixture of experts, not traced"
    if spec.linear_layers:  # a trace would record transformers' torch fallback, not the op autosp runs
        return "hybrid linear attention, priced as the compiler's Gated DeltaNet op runs, not traced"
    if spec.attn_logit_softcap or spec.final_logit_softcap:
        return "logit soft-capping, not traced"
    return None


def resolve_model_and_profile(model) -> tuple[ModelSpec, ModelProfile | None]:
    """(ModelSpec, graph ModelProfile or None for the analytic formulas) of a ``--model`` argument."""
    if isinstance(model, ModelSpec):
        return model, None
    if isinstance(model, ModelProfile):
        return (model.model_spec(), None) if model.source == "analytic" else (model.model_spec(), model)
    if not isinstance(model, str) or not model.strip():
        raise UsageError(f"--model must be a preset name, a path to a config.json or package.module:function, "
                         f"got {model!r}")
    from autosp.cost_models.catalog import models

    arg = model.strip()
    if arg.lower() in models._alias_table():
        return models.resolve_model(arg), None
    if models._looks_like_path(arg):
        parsed = models.resolve_model(arg)  # a clear UsageError for a missing or malformed config
        analytic = _analytic_reason(parsed)
        if analytic:
            return replace(parsed, source=f"analytic formulas ({analytic}) of {parsed.source}"), None
        from autosp.profiling import graph as graph_profile
        from autosp.planner import profile_fallback

        key = graph_profile.fingerprint(arg)
        if graph_profile.read_cached(key) is None:
            if profile_fallback.cached_verdict(key) is not None:
                return profile_fallback.fallback(arg, parsed, key, say=_say), None  # judged before: no new trace
            if not profile_fallback.transformers_available():
                return profile_fallback.fallback(arg, parsed, key, ImportError("no module named transformers"),
                                                 say=_say), None
        try:
            profile = _load(arg)
        except Exception as err:  # noqa: BLE001 - any tracing failure is judged: refused, or priced loudly
            if profile_fallback.transient(err):
                raise  # a broken pipe, a full disk, no memory: the guard's one line; nothing is cached
            return profile_fallback.fallback(arg, parsed, key, err, say=_say), None
        # the profile is cached by content: its name is that of whichever path traced it first; the plan is
        # named after the path given now (parsed.name), as a preset-free sweep row is
        profile = replace(profile, name=parsed.name)
        spec = profile.model_spec()
        spec = replace(spec, name=parsed.name, norm=parsed.norm, max_position=parsed.max_position, rope_theta=parsed.rope_theta,
                       sliding_window=parsed.sliding_window, sliding_layers=parsed.sliding_layers,
                       source=f"graph profile {profile.fingerprint} of {parsed.source}")
        return spec, profile
    if _is_entry_point(arg):
        from autosp.profiling import graph as graph_profile

        module = arg.partition(":")[0]
        if graph_profile._module_file(module) is None:
            raise UsageError(f"cannot find the module {module!r} of the model entry point {arg} on the Python path "
                             "(PYTHONPATH); --model takes a preset, a config.json or package.module:function")
        try:
            profile = _load(arg)
        except Exception as err:  # noqa: BLE001 - one line, whatever the factory raised
            first = str(err).splitlines()[0] if str(err) else ""
            raise UsageError(f"cannot profile the model entry point {arg}: {type(err).__name__}: {first}") from None
        spec = profile.model_spec()
        return replace(spec, source=f"graph profile {profile.fingerprint} of {arg}"), profile
    return models.resolve_model(arg), None  # unknown preset: its UsageError suggests close names


__all__ = ["resolve_model_and_profile"]
