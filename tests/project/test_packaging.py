"""pyproject.toml installs every sub-package: setuptools' explicit ``packages`` list must name each folder
with an ``__init__.py`` under the four mapped folders (a missing one installs from a checkout in editable
mode but is absent from a wheel)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _setuptools() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_sub_package_is_listed_and_every_listed_package_exists():
    config = _setuptools()
    listed = set(config["packages"])
    found = set()
    for package, folder in config["package-dir"].items():
        base = ROOT / folder
        assert (base / "__init__.py").is_file(), f"{package} maps to {folder}, which is not a package"
        for init in base.rglob("__init__.py"):
            if ".venv" in init.parts or "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base).parts
            found.add(".".join((package, *rel)))
    assert sorted(found - listed) == [], "sub-packages missing from pyproject.toml [tool.setuptools] packages"
    assert sorted(listed - found) == [], "pyproject.toml lists packages that do not exist"


def test_package_data_covers_the_catalogs():
    patterns = _setuptools()["package-data"]["*"]
    data = [p for folder in _setuptools()["package-dir"].values() for p in (ROOT / folder).rglob("*")
            if p.suffix in (".toml", ".json") and "__pycache__" not in p.parts]
    assert data, "the model and hardware catalogs ship as package data"
    assert all(any(p.match(pattern) for pattern in patterns) for p in data)
