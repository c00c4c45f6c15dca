"""Bad and odd inputs to the three commands, and what each must answer (issue 10).

- :mod:`.fixtures`: the files the cases point at (a cluster file with ``peak_flops = 0``, a binary "plan",
  a named pipe, a device node, a token file of floats, ...), made on demand in a temporary directory.
- :mod:`.cases`: every case: the command, its arguments, the exit code and a phrase the one-line answer
  must contain. ``tests/project/test_bad_inputs.py`` runs them in-process; ``python -m studies.bad_inputs`` runs
  them as a user would (the installed console scripts, one subprocess each) and writes the table in
  ``docs/bad-inputs.md``.
- :mod:`.run`: running one case either way.
"""
