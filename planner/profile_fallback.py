"""What the planner does with a config.json its graph tracer cannot profile.

Tracing can fail for three kinds of reasons, and each gets its own answer (one line on stderr either way):

- **autosp cannot train the model either** (transformers cannot build it, or builds it with an attention
  that does not run through ``scaled_dot_product_attention``, where autosp shards attention: Gemma-2 in
  transformers 5, for its logit soft-capping): a :class:`~autosp.errors.UsageError`, because a plan must
  only contain what ``autosp-train`` can run.
- **the trace fails but the model is trainable** (an operation FakeTensorMode cannot follow, say): the
  plan is priced with the analytic Llama-block formulas for the config's widths, *provided* they count the
  model's parameters: the model is built on the meta device (no memory, no weights) and its parameters are
  counted; more than :data:`PARAMS_TOLERANCE` apart is a UsageError rather than a silently wrong plan.
- **transformers is not installed**: the same formulas, unchecked, with the install hint
  (:func:`autosp.messages.install_hint`).

A fallback is recorded in the plan: the ModelSpec's ``source`` starts with :data:`FALLBACK_PREFIX` and the
reason, and ``search["model_profile"]`` repeats it (:func:`fallback_reason`). The verdict is cached next
to the graph profiles (``<fingerprint>.failed.json``), so the next plan for the same config neither traces
again nor imports torch; a new transformers or torch changes the fingerprint and earns a new attempt, and so
does another autosp (the record carries :func:`judge_version`: a fixed tracer or judge must get its chance).

Only a deterministic failure of the trace is cached. A failure of the machine or of the run (:func:`transient`:
an OSError such as a broken pipe or a full disk, running out of memory, Ctrl-C) says nothing about the model:
it is never recorded, so the next plan traces again.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from autosp.cost_models.specs import ModelSpec
from autosp.errors import UsageError
from autosp.files import make_cache_dirs
from autosp.messages import install_hint, one_line

__all__ = ["FALLBACK_PREFIX", "PARAMS_TOLERANCE", "cached_verdict", "fallback", "fallback_reason", "judge_version",
           "transformers_available", "transient"]

FALLBACK_PREFIX = "analytic Llama-block formulas (fallback: "
PARAMS_TOLERANCE = 0.01
"""The formulas count attention, MLP, two norms per layer and the embeddings; models with a few extra norm
vectors (Gemma's four per layer) stay far inside 1%; a missing or extra matrix does not."""


def transient(error: BaseException) -> bool:
    """Whether ``error`` comes from the machine or the run rather than from the model (never cached)."""
    return isinstance(error, (OSError, MemoryError, KeyboardInterrupt, SystemExit))


def judge_version() -> str:
    """autosp's version and a hash of this module (the judge): a record made by another one is judged again."""
    import hashlib
    from pathlib import Path

    from autosp.version import __version__

    return f"{__version__}+{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]}"


def fallback_reason(spec: ModelSpec) -> str | None:
    """The recorded reason when ``spec`` is priced by the formulas because its trace failed, else None."""
    source = getattr(spec, "source", "") or ""
    if not source.startswith(FALLBACK_PREFIX):
        return None
    return source[len(FALLBACK_PREFIX):].rsplit(") of ", 1)[0]


def _record_path(key: str):
    from autosp.profiling import graph as graph_profile

    return graph_profile.cache_dir() / f"{key}.failed.json"


def transformers_available() -> bool:
    """Whether transformers can be imported, found without importing it (that would import torch)."""
    import importlib.util

    try:
        return importlib.util.find_spec("transformers") is not None
    except (ValueError, ImportError):  # a module set to None in sys.modules, a broken install
        return False


def _read_record(key: str) -> dict | None:
    try:
        record = json.loads(_record_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != key or record.get("verdict") not in (
            "refuse", "fallback"):
        return None
    if record.get("transformers_available") != transformers_available():
        return None  # judged without transformers and it is here now (or the reverse): judge again
    if record.get("judge_version") != judge_version():
        return None  # judged by another autosp (or a record from before the version was kept): judge again
    return record


def _write_record(record: dict) -> None:
    path = _record_path(record["fingerprint"])
    try:
        make_cache_dirs(path.parent)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a cache: the next run judges again


def _meta_model(config_path: str):
    """(class name, supports SDPA, parameter count) of the model transformers builds for the config, built
    on the meta device (shapes only)."""
    import torch
    from transformers import AutoModelForCausalLM

    from autosp.profiling.graph.trace import load_hf_config

    config = load_hf_config(config_path)
    config.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return type(model).__name__, bool(getattr(type(model), "_supports_sdpa", False)), sum(
        p.numel() for p in model.parameters())


def _judge(arg: str, parsed: ModelSpec, error: BaseException, key: str) -> dict:
    why = one_line(f"{type(error).__name__}: {error}", 200)
    record = {"fingerprint": key, "model": arg, "trace_error": why, "transformers_available": transformers_available(),
              "judge_version": judge_version()}
    try:
        import transformers
    except ImportError:
        reason = f"transformers is not installed, so its graph cannot be traced; {install_hint('hf')}"
        return {**record, "verdict": "fallback", "reason": reason,
                "message": f"warning: {arg}: {reason}; planning with the analytic Llama-block formulas for its "
                           f"widths ({parsed.n_params() / 1e9:.2f}B parameters, not checked against the model); "
                           "recorded in the plan"}
    version = transformers.__version__
    try:
        name, sdpa, n_params = _meta_model(arg)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises, autosp-train could not build it
        return {**record, "verdict": "refuse",
                "message": f"cannot plan {arg}: transformers {version} cannot build it "
                           f"({one_line(f'{type(err).__name__}: {err}', 200)}), so autosp-train could not train it; "
                           "pass a Hugging Face config.json of a decoder-only causal LM or a preset"}
    if not sdpa:
        return {**record, "verdict": "refuse",
                "message": f"cannot plan {arg}: autosp-train cannot train {name}, whose attention does not run "
                           f"through torch.nn.functional.scaled_dot_product_attention in transformers {version} "
                           "(where autosp shards attention); plan a model whose attention does (Llama, Mistral, "
                           "Qwen2, ...) or a preset"}
    formulas = parsed.n_params()
    if abs(formulas - n_params) > PARAMS_TOLERANCE * n_params:
        return {**record, "verdict": "refuse",
                "message": f"cannot price {arg}: its graph trace failed ({why}) and the Llama-block formulas count "
                           f"{formulas / 1e9:.3f}B parameters where {name} has {n_params / 1e9:.3f}B; plan a preset "
                           "or a Llama-family config"}
    reason = f"graph trace failed: {why}"
    return {**record, "verdict": "fallback", "reason": reason, "n_params": n_params,
            "message": f"warning: could not trace {arg} ({why}); planning with the analytic Llama-block formulas "
                       f"for its widths ({formulas / 1e9:.2f}B parameters; {name} has {n_params / 1e9:.2f}B); "
                       "recorded in the plan"}


def cached_verdict(key: str) -> dict | None:
    """The verdict of an earlier failed trace of the model with fingerprint ``key`` (None: none yet)."""
    return _read_record(key)


def fallback(arg: str, parsed: ModelSpec, key: str, error: BaseException | None = None, say=print) -> ModelSpec:
    """The ModelSpec to price ``arg`` with after its trace failed with ``error`` (or was judged before), or a
    UsageError; says the verdict in one line through ``say``."""
    if error is not None and transient(error):
        raise error  # the machine's or the run's failure, not the model's: nothing to judge or cache
    record = _read_record(key)
    if record is None:
        record = _judge(arg, parsed, error if error is not None else RuntimeError("unknown"), key)
        _write_record(record)
    if record["verdict"] == "refuse":
        raise UsageError(record["message"])
    say(record["message"])
    return replace(parsed, source=f"{FALLBACK_PREFIX}{record['reason']}) of {parsed.source}")
