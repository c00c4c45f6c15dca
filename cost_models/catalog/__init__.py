"""The model presets and the hardware catalog: :mod:`.models` (``models.toml``) and :mod:`.hardware`
(``hardware.toml``), every figure citing its public source. They turn what a user types (``llama-3.1-8b``,
a ``config.json``, ``h100x8``, a cluster file) into the specs the cost model prices; the planner, the
calibration tool, the graph-profile tool and ``autosp-train`` all read them from here. No torch.

A package so that wheels ship the TOML files (``pyproject.toml`` package-data)."""
