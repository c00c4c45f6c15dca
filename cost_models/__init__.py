"""Cost models: predict memory and time of a sequence-parallel training candidate without running it.

The analytic model (pure Python floats, no torch) is ``estimate(model, hw, workload, candidate)``;
``memory_only``, ``fits`` and ``max_seq_len`` are cheaper pieces for feasibility and max-context
searches. docs/cost_model.md derives every formula.

The four are imported on first use: every catalog and spec module lives in this package, and a plan cache
hit (which reads the catalogs but prices nothing) should not pay for importing the whole cost model.
"""

import sys
import types

_API = ("estimate", "fits", "max_seq_len", "memory_only")


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        # Importing the submodule estimate.py binds the package attribute ``estimate`` to that module; the
        # package's ``estimate`` is the function (as it was when this file imported it eagerly), so keep it.
        if name == "estimate" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def __getattr__(name):
    if name in _API:
        from importlib import import_module

        value = getattr(import_module("autosp.cost_models.estimate"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package

__all__ = list(_API)
