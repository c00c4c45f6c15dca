"""How fast the planner answers, against ``import torch`` measured in the same run.

    .venv/bin/python -m studies.planner_speed            # ~2 min; prints, and writes studies/results/planner_speed.txt
    .venv/bin/python -m studies.planner_speed --repeat 5

Three timings, each a fresh process (imports included), ``--repeat`` times (median shown, wall and CPU):

- ``cold``: the README's first command, ``autosp-plan --model llama --ctx 200k --hw h100x8 --no-cache``;
- ``hit``: the same request answered from a plan cache (the cache filled once beforehand);
- ``sweep``: ``autosp-plan sweep`` of 1,000 requests (5 models x 8 clusters x 25 contexts, ``--no-cache``,
  ``--jobs`` = the CPUs), ``--repeat`` times;
- ``import torch``: ``python -c "import torch"``, the yardstick: the planner's promise is an answer faster than
  the import of the framework it plans for.

CPU time (user + system of the child processes) is shown beside the wall time: on a machine shared with other
work the wall time is noisy, the CPU time much less.

The children run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed from their environment) and each
command runs once unmeasured first, so modules load from their ``.pyc`` files as in an installed package (pip
compiles them at install time); with it off every import compiles its source, which doubles a cache hit.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "planner_speed.txt"
REQUEST = ["--model", "llama", "--ctx", "200k", "--hw", "h100x8"]
SWEEP_MODELS = "llama-3.2-1b,llama-3.1-8b,llama-3.1-70b,qwen2.5-7b,mistral-7b"
SWEEP_HW = "h100,h100x2,h100x4,h100x8,h100x16,a100-80gx8,h200x8,b200x8"
SWEEP_CTX = ",".join(f"{k}k" for k in (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 200, 256, 320, 400, 512,
                                       640, 800, 1000, 1300, 1600, 2000, 2500))


def _script(name: str) -> list[str]:
    path = Path(sys.executable).with_name(name)
    return [str(path)] if path.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run of ``cmd`` (stdout discarded; a failure raises)."""
    before = os.times()
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(env, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - started
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def median_of(cmd: list[str], repeat: int) -> tuple[float, float]:
    timed(cmd)  # unmeasured: writes the .pyc files (and fills the OS file cache)
    runs = [timed(cmd) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def measure(repeat: int, sweep: bool = True) -> dict:
    plan = _script("autosp-plan")
    out = {"import torch": median_of([sys.executable, "-c", "import torch"], repeat)}
    out["cold"] = median_of(plan + REQUEST + ["--no-cache"], repeat)
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "cache.db")
        timed(plan + REQUEST + ["--cache", cache])
        out["hit"] = median_of(plan + REQUEST + ["--cache", cache], repeat)
    if sweep:  # the median of `repeat` too: the wall time of this machine's 2 cores drifts by a fifth over minutes
        sweep_cmd = plan + ["sweep", "--model", SWEEP_MODELS, "--hw", SWEEP_HW, "--ctx", SWEEP_CTX, "--no-cache",
                            "--csv"]
        runs = [timed(sweep_cmd) for _ in range(repeat)]
        out["sweep 1,000"] = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    return out


TARGETS = {"cold": 1.0, "hit": 0.15, "sweep 1,000": 10.0}
"""Issue 23's targets, wall seconds on the 2-core development machine."""


def render(times: dict, repeat: int) -> str:
    torch_wall, torch_cpu = times["import torch"]
    lines = ["autosp planner speed (python -m studies.planner_speed)",
             f"python {platform.python_version()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
             f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; median of {repeat} fresh processes "
             f"(after one unmeasured run; the sweep without it), .pyc files on", "",
             f"{'':<14}{'wall s':>8}{'CPU s':>8}{'wall / torch':>14}{'CPU / torch':>13}{'target wall':>13}"]
    for name, (wall, cpu) in times.items():
        target = TARGETS.get(name)
        lines.append(f"{name:<14}{wall:8.2f}{cpu:8.2f}{wall / torch_wall:14.2f}{cpu / torch_cpu:13.2f}"
                     f"{(f'{target:.2f}') if target else '-':>13}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.planner_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per timing (default 3)")
    parser.add_argument("--no-sweep", action="store_true", help="leave out the 1,000-request sweep")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    text = render(measure(max(1, args.repeat), sweep=not args.no_sweep), max(1, args.repeat))
    print(text, end="")
    if not args.no_write:
        from autosp.files import write_text

        write_text(RESULTS, text)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
