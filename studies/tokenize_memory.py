"""Peak memory and time of tokenizing a text corpus, at two sizes 10x apart: the windowed ``datasets.map`` path
(``autosp.compiler.data``, at 1 and 2 workers) next to the in-memory path it replaced (issue 34, item 3).

    python -m studies.tokenize_memory                  # 20 MB and 200 MB of text; ~20 min on 2 busy cores
    python -m studies.tokenize_memory --sizes-mb 2 20  # quicker

The corpus is JSON Lines of random words (``{"text": ...}``, 20-400 words a document), tokenized by the
walk-through's word-level tokenizer (``studies/walkthrough_model.py``: a real Hugging Face fast tokenizer,
nothing downloaded). Each run is a fresh Python process with its own empty token cache; this process samples
that process and its ``datasets.map`` workers every 20 ms and records:

- ``peak_mb``: the largest sum of proportional set sizes (PSS, /proc/PID/smaps_rollup) over the tree: its
  resident memory, with the pages a forked worker shares with its parent counted once (a sum of RSS would
  count the parent's ~350 MB of imports once per worker); it includes the pages of memory-mapped files read;
- ``peak_anon_mb``: the same, anonymous pages only (heap, the tokenizer's buffers; no file pages);
- ``baseline_mb``: the child's PSS after its imports and the tokenizer's load, before tokenizing
  (``growth_mb`` = peak minus it: what tokenizing itself adds);
- ``maxrss_self_mb`` / ``maxrss_workers_mb``: the kernel's high-water marks (``getrusage``) of the child and of
  its largest worker;
- the seconds, documents and tokens, and a sha256 of the token stream and document starts, which must agree
  across the rows of one size (the same documents and tokens, whichever path and worker count).

The old path is ``compiler/data/{documents,tokens}.py`` as of commit :data:`OLD_COMMIT` (read with ``git show``,
loaded in the child under their own module names): it reads the documents into memory, tokenizes them in one
Python loop and concatenates the stream in memory.

Times come from a shared machine: the rows of a size run back to back, so compare them within a run only.
Writes studies/results/tokenize_memory.{json,txt}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from studies.bootstrap import ROOT, ensure_autosp

ensure_autosp()

OLD_COMMIT = "c4c8b77"
"""The last commit whose compiler/data/ held the in-memory tokenizer (tokens.py: one Python loop, np.concatenate)."""

RESULTS = ROOT / "studies" / "results"
WORDS = 200
SAMPLE_S = 0.02
MB = 1e6


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """JSON Lines of random-word documents up to ``megabytes`` of file; returns the number of documents."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(WORDS)]
    target, size, documents = int(megabytes * MB), 0, 0
    with open(path, "w") as f:
        while size < target:
            line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randrange(20, 400)))}) + "\n"
            f.write(line)
            size += len(line)
            documents += 1
    return documents


# -- the child: one tokenization ---------------------------------------------------------------------------

def _load_old_modules(folder: str) -> None:
    """Register the old ``documents`` and ``tokens`` modules (from ``folder``) under their product names, so the
    old ``tokens.tokenized`` imports the old ``documents`` (it imports ``autosp.compiler.data.documents``)."""
    import importlib.util

    import autosp.compiler.data  # noqa: F401  (the package; its submodules are replaced below)

    for name in ("documents", "tokens"):
        spec = importlib.util.spec_from_file_location(f"autosp.compiler.data.{name}",
                                                      os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def _pss_mb() -> float:
    return _rollup(os.getpid())["Pss"] / MB


def child(args) -> int:
    import resource

    if args.path == "old":
        _load_old_modules(args.old_dir)
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    tokenizer = load_tokenizer(args.tokenizer)
    import datasets  # noqa: F401  (imported by both paths: in the baseline, not in the growth)
    import transformers  # noqa: F401

    baseline = _pss_mb()
    start = time.perf_counter()
    kwargs = {} if args.path == "old" else {"workers": args.workers[0]}
    data = tokenized(args.corpus, "text", tokenizer, show=False, log=lambda *a, **k: None, **kwargs)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "baseline_mb": baseline, "documents": data.documents,
                      "tokens": int(data.tokens.size), "entry": data.path,
                      "maxrss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB,
                      "maxrss_workers_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / MB}))
    return 0


# -- the parent: sampling, comparing, reporting ------------------------------------------------------------

def _rollup(pid: int) -> dict:
    """``Pss``, ``Pss_Anon``, ``Pss_File`` (bytes) of a process, from /proc/PID/smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Pss_Anon", "Pss_File"):
                out[name] = int(rest.split()[0]) * 1024
    return out


class TreeSampler:
    """The peak proportional set size (PSS) summed over a process and its descendants. PSS, not RSS: the map
    workers are forks that share their parent's pages, which a sum of RSS would count once per worker."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.peak, self.peak_anon, self.done = psutil.Process(pid), 0, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import psutil

        while not self.done.is_set():
            total = anon = 0
            try:
                processes = [self.root] + self.root.children(recursive=True)
            except psutil.Error:
                processes = []
            for p in processes:
                try:
                    rollup = _rollup(p.pid)
                except (OSError, ValueError):
                    continue
                total, anon = total + rollup.get("Pss", 0), anon + rollup.get("Pss_Anon", 0)
            self.peak, self.peak_anon = max(self.peak, total), max(self.peak_anon, anon)
            time.sleep(SAMPLE_S)

    def stop(self):
        self.done.set()
        self.thread.join()


def stream_digest(entry: str) -> str:
    """sha256 of the token stream (as int64) and the document starts, whichever format the entry holds."""
    import numpy as np

    if os.path.exists(os.path.join(entry, "tokens.bin")):
        tokens = np.memmap(os.path.join(entry, "tokens.bin"), dtype=np.int32, mode="r")
        starts = np.memmap(os.path.join(entry, "starts.bin"), dtype=np.int64, mode="r")
    else:
        tokens = np.load(os.path.join(entry, "tokens.npy"), mmap_mode="r")
        starts = np.load(os.path.join(entry, "starts.npy"), mmap_mode="r")
    digest = hashlib.sha256()
    for array in (tokens, starts):
        for first in range(0, array.size, 1 << 24):
            digest.update(np.asarray(array[first:first + (1 << 24)], dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def measure(path: str, workers: int, corpus: Path, tokenizer: str, scratch: Path, old_dir: str) -> dict:
    cache = scratch / f"cache-{path}-{workers}"
    env = dict(os.environ, AUTOSP_DATA_CACHE=str(cache), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "studies.tokenize_memory", "--child", path, "--workers", str(workers),
               "--corpus", str(corpus), "--tokenizer", tokenizer, "--old-dir", old_dir]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(process.pid)
    out, err = process.communicate()
    sampler.stop()
    if process.returncode != 0:
        raise SystemExit(f"{path} (workers {workers}) failed: {err[-3000:]}")
    row = json.loads(out.strip().splitlines()[-1])
    row.update(path=path, workers=workers if path == "new" else None, corpus_mb=corpus.stat().st_size / MB,
               peak_mb=sampler.peak / MB, peak_anon_mb=sampler.peak_anon / MB,
               digest=stream_digest(row.pop("entry")))
    row["growth_mb"] = row["peak_mb"] - row["baseline_mb"]
    shutil.rmtree(cache, ignore_errors=True)
    return row


def report(rows: list[dict], sizes: list[float]) -> str:
    head = (f"{'path':<14} {'corpus MB':>9} {'documents':>10} {'tokens':>12} {'seconds':>8} {'peak MB':>8} "
            f"{'growth MB':>9} {'peak anon MB':>12} {'maxrss self':>11} {'maxrss worker':>13}  stream")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = "old in-memory" if r["path"] == "old" else f"new, {r['workers']} worker{'s' if r['workers'] > 1 else ''}"
        lines.append(f"{name:<14} {r['corpus_mb']:>9.1f} {r['documents']:>10,} {r['tokens']:>12,} {r['seconds']:>8.1f} "
                     f"{r['peak_mb']:>8.0f} {r['growth_mb']:>9.0f} {r['peak_anon_mb']:>12.0f} "
                     f"{r['maxrss_self_mb']:>11.0f} {r['maxrss_workers_mb']:>13.0f}  {r['digest']}")
    small, large = sizes
    lines.append("")
    lines.append(f"corpus {large:g} MB over {small:g} MB ({large / small:g}x):")
    for key in sorted({(r["path"], r["workers"]) for r in rows}, key=str):
        pair = [r for r in rows if (r["path"], r["workers"]) == key]
        a, b = (next(r for r in pair if r["corpus_mb"] < (small + large) / 2),
                next(r for r in pair if r["corpus_mb"] >= (small + large) / 2))
        name = "old in-memory" if key[0] == "old" else f"new, {key[1]} worker{'s' if key[1] > 1 else ''}"
        lines.append(f"  {name:<14} peak x{b['peak_mb'] / a['peak_mb']:.2f}, growth over the baseline "
                     f"x{b['growth_mb'] / max(a['growth_mb'], 1):.2f} ({a['growth_mb']:.0f} -> "
                     f"{b['growth_mb']:.0f} MB), "
                     f"time x{b['seconds'] / a['seconds']:.1f}")
    for size in sizes:
        digests = {r["digest"] for r in rows if abs(r["corpus_mb"] - size) < size / 2}
        lines.append(f"  {size:g} MB: the same token stream on every row: {'yes' if len(digests) == 1 else 'NO'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs=2, default=[20.0, 200.0], help="the two corpus sizes")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="--data-workers of the new path")
    parser.add_argument("--out", default=str(RESULTS / "tokenize_memory"), help="results path without suffix")
    parser.add_argument("--child", choices=("new", "old"), dest="path", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--old-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.path:
        return child(args)
    from studies.walkthrough_model import write_tokenizer

    scratch = Path(tempfile.mkdtemp(prefix="autosp-tokenize-memory-"))
    try:
        tokenizer = str(scratch / "tokenizer")
        write_tokenizer(tokenizer)
        old_dir = scratch / "old"
        old_dir.mkdir()
        for name in ("documents", "tokens"):
            source = subprocess.run(["git", "show", f"{OLD_COMMIT}:compiler/data/{name}.py"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout
            (old_dir / f"{name}.py").write_text(source)
        rows = []
        for size in args.sizes_mb:
            corpus = scratch / f"corpus-{size:g}MB.jsonl"
            write_corpus(corpus, size)
            for path, workers in [("old", 1)] + [("new", w) for w in args.workers]:
                row = measure(path, workers, corpus, tokenizer, scratch, str(old_dir))
                print(f"{path} workers={workers} {size:g} MB: {row['seconds']:.1f} s, peak {row['peak_mb']:.0f} MB "
                      f"(baseline {row['baseline_mb']:.0f}), anon {row['peak_anon_mb']:.0f} MB", flush=True)
                rows.append(row)
            corpus.unlink()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(rows, args.sizes_mb)
    print(text)
    meta = {"old_commit": OLD_COMMIT, "sizes_mb": args.sizes_mb, "workers": args.workers, "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    Path(args.out + ".txt").write_text(f"python -m studies.tokenize_memory --sizes-mb {args.sizes_mb[0]:g} "
                                       f"{args.sizes_mb[1]:g}  ({meta['date']}, {meta['cpus']} CPUs, load "
                                       f"{meta['load_average'][0]:.1f} at the end)\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
