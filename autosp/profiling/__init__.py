"""Measuring what the cost model consumes: the two torch tools that produce its profiles.

- :mod:`.calibration` (``autosp-calibrate``, :mod:`.calibrate`): measures a machine and writes a hardware
  profile (a :class:`~autosp.cost_models.specs.HardwareSpec` JSON) that ``autosp-plan --hw FILE`` reads.
- :mod:`.graph`: traces a model under FakeTensorMode and fits its
  :class:`~autosp.cost_models.profile.ModelProfile` (the cost model's per-layer quantities).

This package may import :mod:`autosp.cost_models` (it produces the data types the model reads); the cost
model never imports it. Importing this package imports no torch.
"""
