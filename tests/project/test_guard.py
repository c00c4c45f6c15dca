"""No exception reaches a user of the three commands as a traceback (issue 10, the guard).

:func:`autosp.guard.run_command` runs every console entry point: an AutospError is its one line and exit
code; anything else is a bug, reported in one line naming the exception, where it was raised, the input
and where to report it, with the traceback in a details file, and exit 1.
"""

import os
import subprocess
import sys

import pytest

from autosp.errors import InfeasibleError, UsageError
from autosp.guard import run_command


def _boom(argv):
    return 1 / 0


def test_an_unexpected_exception_is_one_line_exit_1_with_a_details_file(capsys):
    assert run_command("autosp-plan", _boom, ["--model", "llama", "--ctx", "8k"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("autosp-plan: internal error: ZeroDivisionError: division by zero")
    assert "test_guard.py" in line and "input: --model llama --ctx 8k" in line and "report" in line
    details = line.split(" and ")[-1].split(" (AUTOSP_TRACEBACK")[0]
    text = open(details, encoding="utf-8").read()
    os.unlink(details)
    assert "Traceback (most recent call last)" in text and "1 / 0" in text and "command: autosp-plan --model" in text


def test_autosp_errors_keep_their_exit_codes_and_stay_one_short_line(capsys):
    def usage(argv):
        raise UsageError("bad --ctx\nsecond line " + "x" * 10_000)

    def infeasible(argv):
        raise InfeasibleError("no plan fits")

    assert run_command("autosp-plan", usage, []) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("autosp-plan: error: bad --ctx second line") and len(line) < 500
    assert run_command("autosp-plan", infeasible, []) == 3


def test_only_rank_0_reports_a_usage_error(capsys, monkeypatch):
    def usage(argv):
        raise UsageError("the plan needs 8 processes")

    monkeypatch.setenv("RANK", "1")
    assert run_command("autosp-train", usage, []) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert run_command("autosp-train", usage, []) == 2
    assert capsys.readouterr().err.count("error: the plan needs 8 processes") == 1


def test_a_closed_pipe_is_quiet(capsys):
    def closed(argv):
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command("autosp-plan", closed, []) == 141
    assert capsys.readouterr().err == ""


def test_argparse_help_still_exits_0():
    from autosp.cli import calibrate_main

    with pytest.raises(SystemExit) as stop:
        calibrate_main(["--help"])
    assert stop.value.code == 0


def test_the_console_scripts_run_under_the_guard(tmp_path):
    """A real process: an import-time failure of the command module is still one line (a missing module
    stands in for a broken install)."""
    code = ("import sys; from autosp.cli import _run; "
            "sys.exit(_run('autosp-plan', 'autosp.planner.no_such_module', ['--x']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "internal error: ModuleNotFoundError" in out.stderr
