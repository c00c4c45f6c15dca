"""Import ``autosp.*`` from a plain checkout, without ``pip install``.

The installed package maps ``autosp.planner``, ``autosp.compiler`` and ``autosp.cost_models`` onto the
top-level folders ``planner/``, ``compiler/`` and ``cost_models/`` (``package-dir`` in pyproject.toml;
an editable install does it with an import finder). On a machine where autosp is not installed (the
GPU machine a study runs on: no network, no optuna, nothing installed from this repository), run from
the repository root, ``import autosp`` finds the ``autosp/`` facade folder but not its sub-packages.
:func:`ensure_autosp` adds an import finder that applies the same ``package-dir`` table, read from
pyproject.toml, so that ``python -m studies.<study>`` works from a bare checkout. It does nothing when
``autosp.cost_models`` already imports (an install, editable or not, is used as it is).

Processes started with the ``spawn`` method do not inherit the finder: a module that spawned ranks
unpickle (``studies.measure``) calls :func:`ensure_autosp` before its first ``autosp`` import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "ensure_autosp", "package_dirs"]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``{"autosp.planner": root/"planner", ...}``: pyproject.toml's package-dir for the sub-packages."""
    with open(root / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items() if name != "autosp"}


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds the mapped packages (``autosp.planner`` -> ``planner/``); their sub-modules are then found
    through the package's ``__path__`` by Python's own path finder."""

    def __init__(self, mapping: dict[str, Path]):
        self.mapping = mapping

    def find_spec(self, name, path=None, target=None):
        folder = self.mapping.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def ensure_autosp() -> None:
    """Make ``import autosp.<sub-package>`` work from this checkout if it does not already."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        return
    try:
        if importlib.util.find_spec("autosp.cost_models") is not None:
            return
    except ImportError:  # no autosp at all: the facade comes from ROOT (now on sys.path)
        pass
    sys.meta_path.append(_CheckoutFinder(package_dirs()))
