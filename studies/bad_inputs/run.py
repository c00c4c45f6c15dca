"""Running one bad-input case: in this process (tests) or as the installed console script (the table).

Both return an :class:`Outcome`: exit code, stdout, stderr, and whether a Python traceback reached the
user. Each case runs in its own directory (its fixtures, its plan cache, its profile cache) so that no
case sees another's files.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from studies.bad_inputs.fixtures import DESCRIPTIONS, materialize

__all__ = ["Outcome", "expand", "run_inprocess", "run_subprocess", "verdict"]

TIMEOUT_S = 600


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    @property
    def message(self) -> str:
        """The autosp line on stderr (the last one that names the command), without the command's name."""
        lines = [ln for ln in self.stderr.splitlines() if ln.startswith("autosp-")]
        return lines[-1].split(": ", 1)[1] if lines else ""


def expand(args, directory: Path) -> list[str]:
    """``@name`` -> the fixture's path (made now); ``@out/...`` -> a path in the case directory."""
    out = []
    for arg in args:
        if arg.startswith("@out/"):
            out.append(str(directory / arg[1:]))
        elif arg.startswith("@") and arg[1:] in DESCRIPTIONS:
            out.append(materialize(arg[1:], directory))
        elif arg.startswith("@"):
            name, _, rest = arg[1:].partition("/")
            out.append(os.path.join(materialize(name, directory), rest))  # a path below a fixture
        else:
            out.append(arg)
    return out


def _env(case, directory: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(AUTOSP_CACHE=str(directory / "plans.sqlite"), AUTOSP_CACHE_DIR=str(directory / "cache"),
               AUTOSP_DATA_CACHE=str(directory / "tokens"), OMP_NUM_THREADS="1")
    env.update(case.env)
    return env


@contextlib.contextmanager
def _environment(env: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_inprocess(case, directory: Path) -> Outcome:
    """The case through ``autosp.cli`` in this process (what the console script calls)."""
    from autosp import cli

    main = {"autosp-plan": cli.plan_main, "autosp-train": cli.train_main,
            "autosp-calibrate": cli.calibrate_main, "autosp-export": cli.export_main}[case.command]
    argv = expand(case.args, directory)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    with _environment(_env(case, directory)), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(directory)
        try:
            code = main(argv)
        except SystemExit as stop:  # --help
            code = stop.code if isinstance(stop.code, int) else 1
        finally:
            os.chdir(cwd)
    return Outcome(code, out.getvalue(), err.getvalue())


def run_subprocess(case, directory: Path) -> Outcome:
    """The case as a user runs it: the installed console script, a fresh process."""
    script = Path(sys.executable).with_name(case.command)
    argv = expand(case.args, directory)
    try:
        proc = subprocess.run([str(script), *argv], capture_output=True, text=True, env=_env(case, directory),
                              cwd=directory, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as stop:
        return Outcome(124, stop.stdout or "", (stop.stderr or "") + f"\n(timed out after {TIMEOUT_S} s)")
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def verdict(case, outcome: Outcome, directory: Path) -> list[str]:
    """What is wrong with ``outcome`` for ``case`` (empty: it is the answer the case expects)."""
    problems = []
    if outcome.traceback:
        problems.append("a traceback reached the user")
    if outcome.code != case.exit:
        problems.append(f"exit {outcome.code}, expected {case.exit}")
    ours = [ln for ln in outcome.stderr.splitlines() if ln.startswith(f"{case.command}")]
    if case.answer_on_stdout:
        if case.needle not in outcome.stdout:
            problems.append(f"the report lacks {case.needle!r}")
    elif case.exit != 0:
        errors = [ln for ln in ours if ": error: " in ln]
        silent_rank = case.env.get("RANK", "0") != "0"
        if silent_rank:
            if errors:
                problems.append("a rank other than 0 printed the error")
        elif len(errors) != 1:
            problems.append(f"{len(errors)} error lines, expected exactly one")
        elif case.needle not in errors[0]:
            problems.append(f"the message lacks {case.needle!r}")
        if outcome.stdout.strip() and case.command == "autosp-plan":
            problems.append("a failed command printed on stdout")
    if case.absent:
        path = directory / case.absent.lstrip("@")
        if path.exists():
            problems.append(f"{case.absent} was written")
    return problems
