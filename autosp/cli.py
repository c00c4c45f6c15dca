"""Console entry points. Each one imports its command lazily and turns AutospError into one line."""

from __future__ import annotations

import sys

from autosp.errors import AutospError


def _run(prog: str, module: str, argv=None) -> int:
    try:
        main = getattr(__import__(module, fromlist=["main"]), "main")
        return int(main(argv) or 0)
    except AutospError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def plan_main(argv=None) -> int:
    return _run("autosp-plan", "autosp.planner.cli", argv)


def train_main(argv=None) -> int:
    return _run("autosp-train", "autosp.compiler.train_cli", argv)


def calibrate_main(argv=None) -> int:
    return _run("autosp-calibrate", "autosp.cost_models.calibrate", argv)
