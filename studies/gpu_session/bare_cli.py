"""Run an autosp command from a bare checkout, where autosp is not installed (the GPU machine):

    python3 studies/gpu_session/bare_cli.py train_main ARGS...      # = autosp-train ARGS...
    python3 studies/gpu_session/bare_cli.py calibrate_main ARGS...  # = autosp-calibrate ARGS...

The console scripts of pyproject.toml exist only after ``pip install``; this maps ``autosp.*`` onto the checkout
(:mod:`studies.bootstrap`) and calls the same entry point of :mod:`autosp.cli`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from studies.bootstrap import ensure_autosp  # noqa: E402

ensure_autosp()  # also in spawned ranks, which re-run this file as __mp_main__ (and must not run the command)

if __name__ == "__main__":
    import autosp.cli as cli

    sys.exit(getattr(cli, sys.argv[1])(sys.argv[2:]))
