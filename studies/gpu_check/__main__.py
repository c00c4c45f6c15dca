"""``python -m studies.gpu_check``: see studies/README.md and the package docstring."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from studies.gpu_check import rows as rows_mod

DEFAULT_OUT = Path("out") / "gpu_check"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (no usage block)
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m studies.gpu_check", description=(__import__("studies.gpu_check").gpu_check.__doc__))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for gpu_check.json/.txt (default {DEFAULT_OUT})")
    p.add_argument("--time-budget", type=float, default=420.0, metavar="SECONDS",
                   help="stop gracefully within this many seconds, compiles included (default 420)")
    p.add_argument("--dry-run", action="store_true", help="the same rows at tiny sizes on the CPU (automatic without CUDA)")
    p.add_argument("--hw", default=None, help="hardware to predict with: catalog name or calibrated hardware file "
                                               "(default h200; dry run: studies/results/calibrated-cpux1.json)")
    p.add_argument("--rows", default="", help="comma-separated row names to run, in this order (default all): "
                                              + ", ".join(r.name for r in rows_mod.ROWS))
    p.add_argument("--steps", type=int, default=None, help="timed steps per row, median reported (default 3; dry run 1)")
    p.add_argument("--warmup", type=int, default=1, help="steps before measuring, the first compiles (default 1)")
    p.add_argument("--backend", choices=("inductor", "aot_eager"), default=None,
                   help="torch.compile backend (default inductor on the GPU, aot_eager on the dry run)")
    p.add_argument("--kernel-breakdown", default="", metavar="ROWS",
                   help="comma-separated rows that profile one more step after the timed ones: its device time by "
                        "kernel kind (attention, matmul, collective, copy, other) and the time the device sat idle, "
                        "in gpu_check.json and one line under the table (studies/measure/kernels.py)")
    p.add_argument("--list", action="store_true", help="print the rows with their predictions and exit")
    p.add_argument("--reprice", metavar="JSON", default=None,
                   help="price the measured rows of a committed gpu_check.json again with today's cost model "
                        "(--hw, default the file's hardware) and print then/now next to the measurement; nothing runs")
    return p


def _list(opts) -> int:
    from studies.gpu_check.check import _configs, _default_hw, _model
    from autosp.cost_models import estimate
    from autosp.cost_models.catalog.hardware import resolve_hardware

    hw = resolve_hardware(opts.hw or _default_hw(opts.dry_run))
    selected = rows_mod.select(list(opts.rows))
    for r, cfg in zip(selected, _configs(opts, selected, _model(opts.dry_run), "inductor")):
        est = estimate(cfg.model, hw, cfg.workload(), cfg.candidate())
        print(f"{r.name:<18} S={cfg.seq_len:<6} {cfg.candidate().short():<48} predicted "
              f"{est.memory.total / 2**30:6.1f} GiB, {est.time.step:7.3f} s/step on {hw.name}"
              f"{'' if est.fits else '  (does not fit)'}")
    return 0


def _row_names(text: str) -> tuple:
    """A comma-separated list of row names, each checked (an unknown name raises ValueError)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    rows_mod.select(list(names))
    return names


def main(argv=None) -> int:
    from autosp.errors import AutospError
    from studies.gpu_check.check import CheckOptions, run_check

    args = _parser().parse_args(argv)
    try:
        if args.time_budget <= 0:
            raise ValueError(f"--time-budget must be positive, got {args.time_budget:g}")
        if (args.steps is not None and args.steps < 1) or args.warmup < 1:
            raise ValueError("--steps and --warmup must be at least 1")
        names, profiled = _row_names(args.rows), _row_names(args.kernel_breakdown)
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out}: exists and is not a folder")
        opts = CheckOptions(out=args.out, time_budget=args.time_budget, dry_run=args.dry_run, hw=args.hw, rows=names,
                            warmup=args.warmup, steps=args.steps, backend=args.backend, kernel_breakdown=profiled)
        if args.reprice:
            from studies.gpu_check.reprice import reprice_lines

            try:
                print("\n".join(reprice_lines(args.reprice, args.hw)))
            except (OSError, KeyError, json.JSONDecodeError) as err:
                raise ValueError(f"--reprice {args.reprice}: not a readable gpu_check.json ({err})") from None
            return 0
        if args.list:
            return _list(opts)
        return run_check(opts)
    except (ValueError, AutospError) as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 2)


if __name__ == "__main__":
    sys.exit(main())
