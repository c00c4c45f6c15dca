"""What a new user copies from the docs works (issue 10, item 12).

- The README's training example ran ``torchrun ... $(which autosp-train)``: without an activated venv
  ``which`` prints nothing and torchrun says "unrecognized arguments: --plan".
- The example CI workflow installed ``autosp[db]`` from a package index where autosp is not published.
- Multi-node answers never said whether SP groups could span nodes (then an opt-in flag; now the default,
  ``--no-cross-node-sp`` opts out); warnings ran to 12,000 characters.
"""

import re
import shlex
from pathlib import Path

import yaml

from autosp.cli import plan_main

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _readme_commands(tool: str) -> list[list[str]]:
    """The README's indented shell commands that start with ``tool`` (continuation lines joined)."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith("    ") and line.split()]
    return [shlex.split(line.split("#")[0]) for line in lines if line.split()[0].endswith(tool)]


def test_the_readme_training_example_needs_no_activated_venv_and_parses():
    from autosp.compiler.train_cli import build_parser

    train = _readme_commands("autosp-train")
    assert train, "the README shows how to train"
    for argv in train:
        assert argv[0] == ".venv/bin/autosp-train" and "$(which" not in " ".join(argv)
        args = build_parser().parse_args(argv[1:])  # every flag exists (no "unrecognized arguments")
        assert args.plan.endswith("plan.json") and args.nproc_per_node in (2, 8)  # the walk-through: 2 on a CPU


def test_the_example_workflow_installs_autosp_from_its_checkout():
    workflow = yaml.safe_load((REPO / "docs" / "ci" / "autosp-plan-check.yml").read_text())
    installs = [line.strip() for job in workflow["jobs"].values() for step in job["steps"]
                for line in str(step.get("run", "")).splitlines() if "pip install" in line]
    autosp = [line for line in installs if "autosp" in line.replace("autosp-src/constraints.txt", "")]
    assert autosp and all('"./autosp-src[db]"' in line for line in autosp), installs
    assert not any(re.search(r"pip install [^.]*\bautosp\[", line) for line in installs)


def test_a_multi_node_plan_says_whether_sp_groups_may_span_nodes(capsys):
    argv = ["--model", "llama-3.1-70b", "--ctx", "1M", "--hw", "h100x8", "--nodes", "4", "--no-cache", "--trials", "10"]
    assert plan_main(argv) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "SP groups" in ln)
    assert "may span nodes" in line
    assert plan_main(argv + ["--no-cross-node-sp"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "SP groups" in ln)
    assert "within a node of 8 GPUs (--no-cross-node-sp)" in line and "would need SP groups spanning nodes" in line


def test_a_warning_stays_one_short_line(capsys):
    from autosp.planner.cache import warn_once

    warn_once("plan cache x is unusable (" + "driver said: no\n" * 1000 + "); planning without a cache")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 500 and err.rstrip().endswith("planning without a cache")
