"""How the launcher words a training process that a signal ended (compiler/exit_status.py): the signal's name, and
for SIGKILL whether the kernel's out-of-memory killer ran meanwhile, read from the cgroup's ``oom_kill`` count
(cgroup v2's memory.events, v1's memory.oom_control)."""

import signal

from autosp.compiler import exit_status


def test_a_sigkill_is_attributed_by_the_cgroup_count():
    kill = -signal.SIGKILL
    assert exit_status.killed_how(kill, 3, 4).startswith("was killed by SIGKILL from the kernel's out-of-memory killer")
    assert exit_status.killed_how(kill, 3, 3) == ("was killed by SIGKILL from another process (the kernel's "
                                                  "out-of-memory killer did not run)")
    assert exit_status.killed_how(kill, None, None) == ("was killed by SIGKILL (the kernel does this when host "
                                                        "memory runs out)")
    assert exit_status.killed_how(-signal.SIGSEGV, 0, 1) == "was killed by SIGSEGV"
    assert exit_status.signal_name(200) == "signal 200"


def test_the_count_is_read_from_either_cgroup_version(tmp_path, monkeypatch):
    v2, v1, junk = tmp_path / "memory.events", tmp_path / "memory.oom_control", tmp_path / "junk"
    v2.write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\noom_group_kill 0\n")
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    junk.write_text("oom_kill many\n")
    for files, count in (([str(v2)], 2), ([str(v1)], 5), ([str(tmp_path / "missing"), str(junk), str(v1)], 5),
                         ([], None)):
        monkeypatch.setattr(exit_status, "_counter_files", lambda files=files: files)
        assert exit_status.oom_kills() == count

