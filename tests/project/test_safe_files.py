"""Outputs are written safely (issue 10, item 7): regular files only, atomically, with the umask's mode.

``--plan-out /dev/full`` used to replace the device with a JSON file (exit 0), a symbolic link was
replaced by a file, and plan files were created 0600 whatever the umask. The special files here are made
in the test's temporary directory (a named pipe, a socket, a device node where this process may make
one), never taken from /dev.
"""

import os
import socket
import stat

import pytest

from autosp.cli import plan_main
from autosp.errors import UsageError
from autosp.files import check_output, read_text, write_text

PLAN = ["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "h100x8", "--no-cache", "--trials", "10"]


def _special(kind: str, path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "device":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a null device of our own
        except OSError:
            os.mkfifo(path)  # no right to make device nodes: a pipe takes the same refusal path
    else:
        os.mkdir(path)


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "directory"])
@pytest.mark.parametrize("flag", ["--plan-out", "--ds-config"])
def test_special_files_are_refused_and_left_as_they_were(tmp_path, capsys, kind, flag):
    target = tmp_path / "out.json"
    _special(kind, target)
    before = os.lstat(target)
    assert plan_main([*PLAN, flag, str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autosp-plan: error: ") and "regular file" in err[0], err
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino


def test_a_symlink_is_written_through_and_the_target_keeps_its_mode(tmp_path, capsys):
    real = tmp_path / "plans" / "current.json"
    real.parent.mkdir()
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "plan.json"
    os.symlink(real, link)
    assert plan_main([*PLAN, "--plan-out", str(link)]) == 0
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert '"schema_version"' in real.read_text() and stat.S_IMODE(os.stat(real).st_mode) == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["current.json"]  # no temporary file left


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_a_new_file_gets_the_umask_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_text(tmp_path / "new" / "plan.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "plan.json").st_mode) == mode


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old plan")
    with pytest.raises(UnicodeEncodeError):
        write_text(path, "half \udc80 written")  # encoding fails in the middle of the write
    assert path.read_text() == "old plan" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_check_output_fails_early_and_creates_nothing(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="Not a directory|not a directory"):
        check_output(str(afile / "plan.json"), "--plan-out")
    with pytest.raises(UsageError, match="not a usable file name"):
        check_output("", "--plan-out")
    check_output(str(tmp_path / "deep" / "er" / "plan.json"), "--plan-out")
    assert not (tmp_path / "deep").exists()  # checking creates nothing


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_reading_a_special_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "plan.json"
    _special(kind, path)
    with pytest.raises(UsageError, match="not a file"):
        read_text(path, "plan ")  # opening a named pipe would block forever
