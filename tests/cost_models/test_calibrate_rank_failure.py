"""A calibration rank that fails is reported with its own error (issue 10, item 5).

The handler caught ``torch.multiprocessing.ProcessException``, which torch does not export: any failed
rank surfaced as an AttributeError from the handler instead of the rank's error. Two real rank processes
here measure a matmul of negative size, which torch refuses in each of them.
"""

import dataclasses

import pytest

pytestmark = pytest.mark.slow


def test_a_failed_rank_is_reported_with_its_own_error():
    from autosp.profiling.calibration import launch
    from autosp.profiling.calibration.settings import make_settings

    settings = dataclasses.replace(make_settings("cpu", quick=True), matmul_shapes={"fp32": [(8, -1, 8)], "bf16": []})
    cfg = launch.LaunchConfig(settings=settings, backend="gloo", threads=1, progress=False)
    with pytest.raises(launch.WorkerFailed, match="negative dimension"):
        launch.run_spawned(2, cfg)
