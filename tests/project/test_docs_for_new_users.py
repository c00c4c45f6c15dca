"""What a new user copies from the docs works (issue 10, item 12).

- The README's training example ran ``torchrun ... $(which autosp-train)``: without an activated venv
  ``which`` prints nothing and torchrun says "unrecognized arguments: --plan".
- The example CI workflow installed ``autosp[db]`` from a package index where autosp is not published.
- Multi-node answers never said whether SP groups could span nodes (then an opt-in flag; now the default,
  ``--no-cross-node-sp`` opts out); warnings ran to 12,000 characters.
- Issue 36: the README's ``torchrun --nproc-per-node 2 examples/hf_trainer.py`` was "command not found" without an
  activated venv; the walk-through's 12 steps were over before anyone could interrupt them by hand, and its
  resume step then had nothing left to train; the README did not say how long the test suite takes.
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


def _code(text: str) -> list[str]:
    """The code of a Markdown text: fenced blocks, indented lines and inline code spans."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return fenced + [line for line in prose.splitlines() if line.startswith("    ")] + re.findall(r"`([^`]+)`", prose)


def test_torchrun_is_launched_from_the_venv():
    """A new user has no activated venv: ``torchrun`` alone is "command not found" (the README, the examples'
    docstrings and docs/hf-trainers.md, which show how to launch the examples)."""
    import ast

    texts = {name: (REPO / name).read_text() for name in ("README.md", "docs/hf-trainers.md")}
    for script in sorted((REPO / "examples").glob("*.py")):
        texts[f"examples/{script.name}"] = ast.get_docstring(ast.parse(script.read_text())) or ""
    launches = {name: re.findall(r"(\S*torchrun)\s+--", " ".join(_code(text)) if name.endswith(".md") else text)
                for name, text in texts.items()}
    assert launches["README.md"] and launches["examples/hf_trainer.py"]
    assert {name: [cmd for cmd in cmds if cmd != ".venv/bin/torchrun"] for name, cmds in launches.items()} == \
        {name: [] for name in launches}


def _walk_through() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("### Walk-through")[1].split("\n## ")[0]


def test_the_walk_through_can_be_interrupted_by_hand_and_resumed():
    """Step 2 trains long enough to press Ctrl-C (the README says how long a step takes here), the unattended way
    is named (``timeout -s TERM``), and the resume step is step 2's command with ``--resume``: it continues a
    run stopped at any step before the last."""
    from autosp.compiler.train_cli import build_parser

    train = [argv for argv in _readme_commands("autosp-train") if "out/walk/plan.json" in argv]
    assert len(train) == 2, train
    first, resume = train
    assert resume[:len(first)] == first and resume[len(first)] == "--resume"
    args = build_parser().parse_args(first[1:])
    assert args.steps >= 100 and args.save_every < args.steps  # about 1 s a step here: minutes, not seconds
    walk = _walk_through()
    assert "timeout -s TERM" in walk and "Ctrl-C" in walk


def test_the_readme_says_how_long_the_test_suite_takes():
    section = (REPO / "README.md").read_text().split("Run the test suite")[1].split("`.ci/run` first")[0]
    took = re.search(r"suite took ([\d,]+) s", section.replace("\n", " "))
    assert took and int(took.group(1).replace(",", "")) > 60, section
