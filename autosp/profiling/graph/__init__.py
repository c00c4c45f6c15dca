"""Graph-derived model profiles: trace a causal LM under FakeTensorMode, fit its per-layer costs.

``load_or_build(model_arg)`` returns the :class:`~autosp.cost_models.profile.ModelProfile` of a
Hugging Face ``config.json`` (a file, or a directory holding one) or of an ``nn.Module`` factory given
as ``package.module:function``. Profiles are cached as JSON per model fingerprint in
``$AUTOSP_CACHE_DIR/profiles/`` (else ``$XDG_CACHE_HOME/autosp/profiles/``, else
``~/.cache/autosp/profiles/``): a cache hit reads one small file and never imports torch; a miss
traces the model (seconds, with progress on stderr) and writes the file.

The fingerprint covers what the profile depends on: the config's contents (or the factory's entry
point and its source file), the torch and transformers versions (read from package metadata, no
import), the traced sequence lengths, the profile schema and the source of this package. Editing a
module the factory imports is not seen: pass ``rebuild=True`` (CLI: ``--rebuild``).

``python -m autosp.profiling.graph MODEL [--json]`` prints the profile and its comparison
with the analytic formulas; docs/graph_profile.md explains every difference.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from autosp.profiling.graph.model_arg import describe_model_arg
from autosp.cost_models.profile import PROFILE_SCHEMA, ModelProfile
from autosp.files import cache_subdir, make_cache_dirs

__all__ = ["ModelProfile", "cache_dir", "describe_model_arg", "fingerprint", "load_or_build", "preset_config"]

_HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    return cache_subdir("profiles")


def _module_file(module: str) -> Path | None:
    """The source file of ``module`` found on sys.path without importing it (importing might import torch)."""
    parts = module.split(".")
    for base in sys.path:
        root = Path(base or ".").joinpath(*parts)
        for candidate in (root.with_suffix(".py"), root / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(_HERE.glob("*.py")) + [Path(sys.modules[ModelProfile.__module__].__file__)]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def fingerprint(model_arg: str, seq_lens=None) -> str:
    """The cache key of a model argument (see the module docstring); no torch import."""
    kind, target = describe_model_arg(model_arg)
    digest = hashlib.sha256()
    digest.update(kind.encode())
    if kind == "config":
        with open(target, encoding="utf-8") as f:
            data = json.load(f)
        digest.update(json.dumps(data, sort_keys=True).encode())
    else:
        digest.update(target.encode())
        path = _module_file(target.partition(":")[0])
        if path is not None:
            digest.update(path.read_bytes())
    for dist in ("torch", "transformers"):
        digest.update(f"{dist}={_dist_version(dist)}".encode())
    digest.update(f"schema={PROFILE_SCHEMA};seq={tuple(seq_lens) if seq_lens else 'default'}".encode())
    digest.update(_source_hash().encode())
    return digest.hexdigest()[:20]


def cache_path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


def read_cached(key: str) -> ModelProfile | None:
    path = cache_path(key)
    try:
        text = path.read_text(encoding="utf-8")
        profile = ModelProfile.from_json(text)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as err:
        print(f"autosp graph profile: ignoring unreadable cached profile {path} ({err})", file=sys.stderr)
        return None
    if profile.schema != PROFILE_SCHEMA or profile.fingerprint != key:
        return None
    return profile


def write_cached(profile: ModelProfile) -> Path | None:
    path = cache_path(profile.fingerprint)
    try:
        make_cache_dirs(path.parent)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(profile.to_json(), encoding="utf-8")
        os.replace(tmp, path)
        return path
    except OSError as err:
        print(f"autosp graph profile: cannot cache the profile in {path.parent} ({err})", file=sys.stderr)
        return None


def load_or_build(model_arg: str, *, rebuild: bool = False, seq_lens=None, quiet: bool = False) -> ModelProfile:
    """The graph profile of ``model_arg``: from the cache (no torch import) or traced and cached."""
    key = fingerprint(model_arg, seq_lens)
    if not rebuild:
        cached = read_cached(key)
        if cached is not None:
            return cached
    from autosp.profiling.graph.build import build_profile_for

    profile = build_profile_for(model_arg, fingerprint=key, seq_lens=seq_lens, quiet=quiet)
    write_cached(profile)
    return profile


def hf_config_of(spec) -> dict:
    """A Hugging Face config.json (as a dict) for a Llama-family ModelSpec: ``qwen2`` when it has q/k/v
    biases, ``llama`` otherwise (Mistral's dense block is the same)."""
    cfg = {"model_type": "qwen2" if spec.qkv_bias else "llama", "hidden_size": spec.hidden,
           "intermediate_size": spec.ffn_hidden, "num_attention_heads": spec.n_heads,
           "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "num_hidden_layers": spec.n_layers,
           "vocab_size": spec.vocab, "max_position_embeddings": spec.max_position or 131072,
           "rope_theta": spec.rope_theta, "rms_norm_eps": 1e-5, "tie_word_embeddings": spec.tied_embeddings,
           "hidden_act": "silu" if spec.gated_mlp else "gelu", "_name_or_path": spec.name}
    if spec.qkv_bias:
        cfg["use_sliding_window"] = False
    else:
        cfg.update(attention_bias=False, mlp_bias=False)
    return cfg


def preset_config(name: str) -> str:
    """Write the config.json of a planner preset (cost_models/catalog/models.toml) under the cache directory and
    return its path, so a preset can be profiled like any config (the cross-check of docs/graph_profile.md)."""
    from autosp.cost_models.catalog.models import resolve_model

    spec = resolve_model(name)
    if not spec.gated_mlp:
        raise ValueError(f"preset {spec.name} is not a gated-MLP Llama-family model")
    folder = cache_dir() / "preset-configs" / spec.name.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    text = json.dumps(hf_config_of(spec), indent=1, sort_keys=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return str(path)
