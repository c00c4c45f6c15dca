"""Version stamps of the code a plan's answer depends on (for the plan cache key and ``autosp-plan check``).

- :func:`code_version`: a hash of the planner's and the cost model's sources that decide *which* plan
  comes out (the search, the space, the evaluator, the catalogs' readers, every cost-model formula).
  Presentation and infrastructure files (the CLI, the report, the cache, the CI checks, the measured
  trials, this file) are left out: changing them never changes an answer.
- :func:`cost_model_version`: a hash of the cost model alone (``cost_models/`` and the graph profiler
  ``autosp/profiling/graph/``, without the calibration tool, which only writes hardware files that are
  fingerprinted on their own, and without the catalogs' readers, whose output is fingerprinted too). A plan's prediction is
  reproducible exactly when this and the model/hardware fingerprints are unchanged.
- ``space.SPACE_VERSION``: the search space (its own module).

Each is a short hex digest of file contents, so a release and a development tree with the same sources
agree, and any edit to a formula changes it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import autosp.profiling

_PLANNER = Path(__file__).resolve().parent
_COST_MODELS = _PLANNER.parent / "cost_models"
# autosp/profiling sits under autosp/ in the source tree but beside planner/ in an installed wheel: found through
# the (torch-free) package itself, and named by the same label in both layouts (see _label)
_GRAPH_PROFILING = Path(autosp.profiling.__file__).resolve().parent / "graph"

PRESENTATION = frozenset({"ds_config.py", "check.py", "artifacts.py", "reprice.py", "measure.py", "versions.py"})
"""Planner modules that never change which plan comes out (left out of :func:`code_version`; so are the
plan cache and the command lines with their reports, sub-packages)."""


def _cost_model_files() -> list[Path]:
    """The cost model's formulas, and the graph profiler whose profiles they price (it was part of
    ``cost_models/`` once; its source is still part of the stamp)."""
    return sorted([p for p in _COST_MODELS.rglob("*.py") if "catalog" not in p.relative_to(_COST_MODELS).parts]
                  + list(_GRAPH_PROFILING.glob("*.py")))


def _catalog_files() -> list[Path]:
    return sorted((_COST_MODELS / "catalog").glob("*.py"))


def _label(path: Path) -> str:
    if path.is_relative_to(_GRAPH_PROFILING):
        return str(Path("profiling", "graph", path.relative_to(_GRAPH_PROFILING)))
    return str(path.relative_to(_PLANNER.parent))


def _digest(paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(_label(path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def cost_model_version() -> str:
    return _digest(_cost_model_files())


@lru_cache(maxsize=1)
def code_version() -> str:
    planner = sorted([p for p in _PLANNER.glob("*.py") if p.name not in PRESENTATION]
                     + list((_PLANNER / "search").glob("*.py")))
    return _digest(planner + _catalog_files() + _cost_model_files())


def stamps() -> dict:
    """{autosp, space, cost_model, code}: what ``autosp-plan check`` compares."""
    from autosp.planner.search.space import SPACE_VERSION
    from autosp.version import __version__

    return {"autosp": __version__, "space": SPACE_VERSION, "cost_model": cost_model_version(),
            "code": code_version()}


__all__ = ["PRESENTATION", "code_version", "cost_model_version", "stamps"]
