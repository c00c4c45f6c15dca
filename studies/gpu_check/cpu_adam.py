"""DeepSpeed's CPU Adam for the optimizer-offload rows: built in the background, waited for per row.

On CUDA, ``autosp.compile`` runs ZeRO-Offload's host-side step with DeepSpeed's ``DeepSpeedCPUAdam``
(the cost model prices that optimizer), which DeepSpeed compiles on first use (JIT, ninja + the host C++
compiler: two C++ files, about 65 s of CPU each when measured on this project's development machine).
The check starts that build in a separate process at its start (:func:`start_build`), so it runs while
the first rows compile and train; :func:`require_cpu_adam` is the harness's per-row ``prepare`` hook:
an optimizer-offload row waits for the build, and fails with the build's own error if it failed.
Nothing else in the check needs a DeepSpeed op built (the other rows use ``torch.optim.AdamW``).

``python -m studies.gpu_check.cpu_adam STATUS.json`` is the build process: it writes
``{"ok": bool, "seconds": float, "error": str}`` to STATUS.json when done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

__all__ = ["require_cpu_adam", "start_build", "status"]


def start_build(status_path: str, log_path: str) -> subprocess.Popen:
    """Start the build in a child process (its output goes to ``log_path``)."""
    from studies.bootstrap import ROOT

    with open(log_path, "w", encoding="utf-8") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "studies.gpu_check.cpu_adam", status_path], cwd=str(ROOT),
                                stdout=log, stderr=subprocess.STDOUT)


def status(status_path: str) -> dict | None:
    """The build's result, or None while it runs."""
    try:
        with open(status_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def require_cpu_adam(status_path: str, cfg) -> None:
    """Harness ``prepare`` hook: for an optimizer-offload row, wait until the build finished; raise its
    error if it failed (the row then reports it). Other rows pass straight through. The harness's deadline
    bounds the wait."""
    if not cfg.offload_optimizer:
        return
    while (result := status(status_path)) is None:
        time.sleep(1.0)
    if not result["ok"]:
        raise RuntimeError(f"DeepSpeedCPUAdam (ZeRO-Offload's host optimizer) could not be built in "
                           f"{result['seconds']:.0f} s: {result['error']}")


def _build() -> dict:
    t0 = time.perf_counter()
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        CPUAdamBuilder().load()
        return {"ok": True, "seconds": time.perf_counter() - t0, "error": ""}
    except Exception as err:  # noqa: BLE001 - any failure is the finding
        text = str(err).strip().splitlines()
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "error": f"{type(err).__name__}: {text[-1] if text else ''}"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0]
    result = _build()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, path)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
