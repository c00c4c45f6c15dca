"""The accelerator table of the hardware catalog (``hardware.toml``: every figure with its public source),
read once. :mod:`autosp.cost_models.catalog.hardware` builds clusters from it; the hardware checks look up
a calibrated device's catalog twin in it."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

DATA_FILE = Path(__file__).with_name("hardware.toml")


@lru_cache(maxsize=1)
def _raw_catalog() -> dict:
    from autosp.cost_models.catalog.parsed import load_toml

    return load_toml(DATA_FILE)


def accelerator_table() -> dict:
    """{accelerator name: its catalog entry} (the ``[accelerators]`` table)."""
    return _raw_catalog()["accelerators"]


def common_sources() -> dict:
    """Sources shared by every entry (link figures, efficiencies)."""
    return dict(_raw_catalog().get("common_sources", {}))


__all__ = ["DATA_FILE", "accelerator_table", "common_sources"]
