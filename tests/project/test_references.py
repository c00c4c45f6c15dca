"""Every file the repository cites exists in it: markdown links, and paths into the repository's own
folders named in code, docs and configuration (``docs/design.md``, ``tests/project/test_packaging.py``,
``cost_models/memory.py``, ...). A reference to a file the repository does not contain sends a reader
nowhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
TOP = ("autosp", "planner", "compiler", "cost_models", "studies", "tests", "docs", ".ci")
TEXT = (".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w-])" % "|".join(re.escape(t) for t in TOP))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
BARE_DOC = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line.endswith(TEXT)]


def _exists(ref: str, where: Path) -> bool:
    ref = ref.rstrip(".")
    return any((base / ref).exists() for base in (ROOT, where.parent))


def test_every_cited_file_exists():
    missing = []
    files = _tracked()
    docs = {p.name for p in files if p.suffix == ".md"}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for match in PATH.finditer(text):
            ref = match.group(1)
            if any(c in text[match.end():match.end() + 2] for c in "{*<") or ref.endswith("/"):
                continue  # a pattern (results/x{1,2}.json, tests/*.py), not one file
            if not _exists(ref, path):
                missing.append(f"{rel}: {ref}")
        if path.suffix == ".md":
            for ref in LINK.findall(text):
                if "://" not in ref and not ref.startswith("mailto:") and not _exists(ref, path):
                    missing.append(f"{rel}: ({ref})")
        for name in BARE_DOC.findall(text):
            if name not in docs and name.lower() != "readme.md":
                missing.append(f"{rel}: {name}")
    assert missing == [], "references to files the repository does not contain:\n" + "\n".join(sorted(set(missing)))
