"""Measurement harness: one plan configuration, run for real (compiled SP step under DeepSpeed), measured.

    from studies.measure import RunConfig, measure, measure_many
    row = measure(RunConfig(model=spec, seq_len=1024, sp=2, zero_stage=1), hardware=hw)

A plain script package (run from the repository root; not installed). ``python -m studies.measure --help``
runs one configuration from the command line. See harness.py (what a run does) and memory.py (what each
memory figure is, and which one equals which term of the cost model).
"""

from studies.bootstrap import ensure_autosp

ensure_autosp()  # spawned ranks import this package first: autosp.* must resolve without an install

from studies.measure.harness import RunConfig, make_plan, measure, measure_many  # noqa: E402

__all__ = ["RunConfig", "make_plan", "measure", "measure_many"]
