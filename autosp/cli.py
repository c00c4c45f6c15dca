"""Console entry points. Each one imports its command lazily and runs it under :mod:`autosp.guard`, which
turns every failure into one line and a documented exit code (never a traceback)."""

from __future__ import annotations

from autosp.guard import run_command


def _run(prog: str, module: str, argv=None) -> int:
    def main(args):
        return getattr(__import__(module, fromlist=["main"]), "main")(args)

    return run_command(prog, main, argv)


def plan_main(argv=None) -> int:
    return _run("autosp-plan", "autosp.planner.cli.main", argv)


def train_main(argv=None) -> int:
    return _run("autosp-train", "autosp.compiler.train_cli", argv)


def export_main(argv=None) -> int:
    return _run("autosp-export", "autosp.compiler.training.export", argv)


def calibrate_main(argv=None) -> int:
    return _run("autosp-calibrate", "autosp.profiling.calibrate", argv)


__all__ = ["calibrate_main", "export_main", "plan_main", "train_main"]
