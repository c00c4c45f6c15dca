"""What a graph profile is built from: a Hugging Face ``config.json`` (or its directory) or a
``package.module:function`` model factory, told apart without importing torch."""

from __future__ import annotations

import os


def describe_model_arg(model_arg: str) -> tuple[str, str]:
    """("config", path of the config.json) or ("entry", "package.module:function")."""
    if not isinstance(model_arg, str) or not model_arg.strip():
        raise ValueError("no model given: pass a Hugging Face config.json (or its directory) or package.module:function")
    arg = model_arg.strip()
    if os.path.isdir(arg):
        path = os.path.join(arg, "config.json")
        if not os.path.isfile(path):
            raise ValueError(f"{arg} is a directory without a config.json")
        return "config", path
    if arg.lower().endswith(".json") or os.path.exists(arg):
        if not os.path.isfile(arg):
            raise ValueError(f"model config {arg} does not exist")
        return "config", arg
    module, sep, attr = arg.partition(":")
    if sep and module and attr and all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        return "entry", arg
    raise ValueError(f"{arg!r} is neither a config.json path nor a package.module:function entry point")


__all__ = ["describe_model_arg"]
