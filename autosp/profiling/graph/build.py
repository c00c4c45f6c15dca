"""Trace a model at a few sequence lengths and build its graph :class:`ModelProfile` (imports torch).

Per-layer quantities come from *module attribution* in a 2-layer trace (the last decoder layer: its
input comes from another layer, as in the real stack), at each sequence length; a 1-layer trace at
the middle length is *differenced* against the 2-layer one as a check: the layer's saved bytes,
forward and backward FLOPs and parameters by attribution must equal what adding a layer adds to the
whole model (``details['check_*']``; a gap means something per-layer escaped attribution, e.g. a
tensor made outside the layer per layer). Attribution is needed anyway: the checkpointing policies
are derived from which op produced each saved tensor and what it was computed from.
"""

from __future__ import annotations

import sys
import time

from autosp.profiling.graph import analyze, assemble
from autosp.profiling.graph import trace as T

DEFAULT_SEQ_LENS = (333, 667, 1001)
"""Odd lengths, so that no model width equals a sequence length (a [s, width] tensor would then look like
an S x S attention matrix); the fits need three to show their residual. Fake tensors cost the same at
any length."""


def _step_totals(tr) -> dict:
    skip = tr.param_sids | tr.buffer_sids | tr.input_sids
    return {"saved": sum(tr.storages[s].nbytes for s in tr.saved if s not in skip),
            "fwd": sum(o.flops for o in tr.ops[:tr.backward_start]),
            "bwd": sum(o.flops for o in tr.ops[tr.backward_start:]),
            "params": tr.params["total"]}


def _params(tr) -> dict:
    p = tr.params
    prefix = p["layer_prefix"]
    last = str(tr.n_layers - 1)
    layer = p["per_layer"].get(last, 0)
    layer_small = p["layers_small"] // max(1, tr.n_layers)
    bias = any(len(shape) == 1 and name.startswith(f"{prefix}.{last}.") and name.endswith("bias")
               and any(k in name for k in ("q_proj", "k_proj", "v_proj", "qkv", "c_attn", "query", "key", "value"))
               for name, shape in p["shapes"].items())
    return {"layer": layer, "layer_small": layer_small, "other": p["other"], "other_small": p["other_small"],
            "largest_other": p["largest_other"], "tied": p["tied"], "qkv_bias": bias}


def _versions() -> tuple:
    import torch

    out = [("torch", torch.__version__)]
    try:
        import transformers

        out.append(("transformers", transformers.__version__))
    except ImportError:
        pass
    return tuple(out)


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"autosp graph profile: {msg}", file=sys.stderr, flush=True)


def seq_lens_for(max_position: int | None, requested=None, avoid=()) -> tuple:
    """The traced lengths: ``requested`` or the defaults, scaled under ``max_position``, moved off any
    model width in ``avoid``."""
    lens = tuple(int(x) for x in requested) if requested else DEFAULT_SEQ_LENS
    if max_position and max_position > 0 and max(lens) > max_position:
        top = max_position
        lens = (max(2, top // 3), max(3, 2 * top // 3), top)
    avoid = set(avoid)
    moved = []
    for s in lens:
        while s in avoid or s in moved:
            s -= 1
        moved.append(s)
    lens = tuple(moved)
    if len(set(lens)) < 2 or min(lens) < 2:
        raise ValueError(f"need at least two distinct sequence lengths to fit, got {lens}")
    return lens


def _config_ints(config) -> set:
    out = set()
    for value in config.to_dict().values():
        if isinstance(value, int) and not isinstance(value, bool):
            out.add(value)
    return out


def build_profile_for(model_arg: str, *, fingerprint: str = "", seq_lens=None, quiet: bool = False):
    """Trace ``model_arg`` (a config.json path / directory or ``package.module:function``) and return its
    graph ModelProfile."""
    from autosp.profiling.graph.model_arg import describe_model_arg

    kind, target = describe_model_arg(model_arg)
    max_position = None
    if kind == "config":
        config = T.load_hf_config(target)
        build = T.hf_builder(config)
        n_layers = T.full_layers_of_config(config)
        name = getattr(config, "_name_or_path", "") or _config_name(target)
        max_position = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        vocab = getattr(config, "vocab_size", None)
    else:
        factory = T.load_entry_point(target)
        build, full_layers = T.factory_builder(factory)
        n_layers = full_layers()
        name = target
        vocab = None
    lens = seq_lens_for(max_position, seq_lens, avoid=_config_ints(config) if kind == "config" else ())
    mid = lens[len(lens) // 2]
    start = time.perf_counter()
    _say(f"tracing {name} under FakeTensorMode ({n_layers} layers; traced with 1 and 2) at {len(lens)} sequence "
         f"lengths {', '.join(map(str, lens))} ...", quiet)
    measurements, traces2 = [], {}
    for s in lens:
        tr = T.trace_step(build, 2, s, vocab_hint=vocab)
        traces2[s] = tr
        measurements.append(analyze.measure(tr))
        _say(f"  2 layers @ {s} tokens: {len(tr.ops)} ops ({time.perf_counter() - start:.1f}s)", quiet)
    tr1 = T.trace_step(build, 1, mid, vocab_hint=vocab)
    _say(f"  1 layer  @ {mid} tokens: {len(tr1.ops)} ops ({time.perf_counter() - start:.1f}s)", quiet)
    two, one = _step_totals(traces2[mid]), _step_totals(tr1)
    m = measurements[lens.index(mid)]
    checks = {
        "check_saved_bytes": (int(m["saved_none_bytes"]), two["saved"] - one["saved"]),
        "check_fwd_flops": (m["mm_fwd"] + m["attn_fwd"], two["fwd"] - one["fwd"]),
        "check_bwd_flops": (m["mm_bwd"] + m["attn_bwd"], two["bwd"] - one["bwd"]),
        "check_params": (_params(traces2[mid])["layer"], two["params"] - one["params"]),
    }
    notes = []
    for key, (attributed, differenced) in checks.items():
        if attributed != differenced:
            notes.append(f"{key[6:]}: module attribution gives {attributed:,}, adding a layer adds {differenced:,}")
    profile = assemble.build_profile(name, lens, measurements, _params(traces2[mid]), n_layers,
                                    fingerprint=fingerprint, versions=_versions(), notes=tuple(notes), checks=checks)
    if profile.fit_residual > 1e-9:
        worst = ", ".join(f"{k} {r:.2g}" for k, r in profile.fit[:3])
        _say(f"warning: some quantities are not of the fitted form in the sequence length ({worst})", quiet)
    _say(f"done in {time.perf_counter() - start:.1f}s", quiet)
    return profile


def _config_name(path: str) -> str:
    import os

    path = os.path.abspath(path)
    if os.path.basename(path) == "config.json":
        path = os.path.dirname(path)
    return os.path.basename(path) or "custom"


__all__ = ["DEFAULT_SEQ_LENS", "build_profile_for", "seq_lens_for"]
