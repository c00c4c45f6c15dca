"""Tokenizing documents once: the tokenizer, its fingerprint, and the token cache.

A run tokenizes every document (``add_special_tokens`` as the tokenizer's defaults say: Llama's adds
BOS), appends the tokenizer's EOS to each (unless it already ends with it), skips empty ones, and stores the
ids and the document boundaries as memory-mapped files (:mod:`.tokenizing`, with ``--data-workers`` processes).
The result is cached under ``$AUTOSP_DATA_CACHE`` (else ``$XDG_CACHE_HOME/autosp/tokens``, else
``~/.cache/autosp/tokens``) in a directory named by the data files' identity (size, mtime and a sample of their
bytes: :func:`~autosp.compiler.data.identity.data_identity`), the tokenizer's fingerprint, the text field and the
cache format; the file's name plays no part, so a renamed file hits and an edited one misses. How the entry is
published atomically and shared by concurrent processes: :mod:`.cache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass

import numpy as np

from autosp.compiler.data.cache import FORMAT, building, cache_root, read_entry
from autosp.errors import UsageError
from autosp.messages import install_hint, one_line


def load_tokenizer(path: str | None, flag: str = "--tokenizer"):
    """The Hugging Face tokenizer in directory ``path``, checked to have an EOS token."""
    if path is None:
        raise UsageError("text data needs a tokenizer: give --tokenizer DIR (a Hugging Face tokenizer directory), "
                         "or a --model directory that holds one")
    if not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is not a directory (a Hugging Face tokenizer directory: tokenizer.json, "
                         "tokenizer_config.json, ...)")
    try:
        import transformers
    except ImportError:
        raise UsageError(f"tokenizing text needs transformers: {install_hint('train')}") from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - no tokenizer files, malformed JSON, missing vocab: one line
        raise UsageError(f"{flag} {path} holds no tokenizer transformers can load: {one_line(err, 200)}") from None
    if tokenizer.eos_token_id is None:
        raise UsageError(f"the tokenizer in {path} has no EOS token, and autosp ends every document with it; "
                         "set eos_token in its tokenizer_config.json")
    return tokenizer


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides the ids: the fast tokenizer's full JSON (vocabulary, merges, normalizer,
    pre-tokenizer, post-processor), its class and special tokens; for a slow tokenizer, its vocabulary."""
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    digest.update(json.dumps({"eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id,
                              "special": sorted(map(str, tokenizer.all_special_tokens))}).encode())
    if getattr(tokenizer, "is_fast", False):
        digest.update(tokenizer.backend_tokenizer.to_str().encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class TokenizedData:
    """The token stream of a text dataset: ``tokens`` (1-D, memory-mapped) and ``starts`` (the offset of
    every document, then the stream's length; memory-mapped for the cache's entries)."""

    tokens: np.ndarray
    starts: np.ndarray
    key: str
    cached: bool  # read from the cache (not tokenized by this call)
    path: str
    skipped: int = 0  # empty documents, not in the stream

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


def cache_key(identity: str, tokenizer_fp: str, text_field: str) -> str:
    return hashlib.sha256(json.dumps([FORMAT, identity, tokenizer_fp, text_field]).encode()).hexdigest()[:32]


def _entry(directory: str, key: str, cached: bool) -> TokenizedData | None:
    found = read_entry(directory)
    if found is None:
        return None
    tokens, starts, meta = found
    return TokenizedData(tokens=tokens, starts=starts, key=key, cached=cached, path=directory,
                         skipped=int(meta.get("skipped", 0)))


def describe(path: str, data: TokenizedData) -> str:
    skipped = f" ({data.skipped:,} empty skipped)" if data.skipped else ""
    return f"{path}: {data.documents:,} documents{skipped}, {int(data.tokens.size):,} tokens"


def _build(path: str, text_field: str, tokenizer, build, directory: str, flag: str, workers: int, log):
    """Tokenize ``path`` into a new entry at ``directory`` (the caller holds the key's lock)."""
    from autosp.compiler.data.documents import load_documents
    from autosp.compiler.data.tokenizing import Progress, workers_for, write_token_files

    with build.temporary(directory) as tmp:
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        start = time.perf_counter()
        documents = load_documents(path, text_field, work, flag)
        workers = workers_for(documents.nbytes, workers)
        log(f"autosp-train: tokenizing {documents.rows:,} documents of {path} with {workers} worker"
            f"{'s' if workers > 1 else ''}, once (the next runs read the token cache {directory})", flush=True)
        progress = Progress(documents.rows, os.path.basename(path.rstrip("/")), log)
        try:
            counts = write_token_files(documents, tokenizer, tmp, work, workers, progress)
        finally:
            progress.close()
        if counts.tokens == 0:
            raise UsageError(f"{flag} {path} holds no text (every document is empty)")
        shutil.rmtree(work)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"format": FORMAT, "documents": counts.documents, "skipped": counts.skipped,
                       "tokens": counts.tokens, "source": os.path.abspath(path), "text_field": text_field,
                       "workers": workers, "seconds": round(time.perf_counter() - start, 3)}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    data = _entry(directory, build.key, cached=False)
    log(f"autosp-train: {describe(path, data)}, tokenized in {time.perf_counter() - start:.1f} s", flush=True)
    return data


def tokenized(path: str, text_field: str, tokenizer, *, show: bool = True, flag: str = "--data", log=print,
              workers: int = 1) -> TokenizedData:
    """The tokenized documents of ``path``: from the cache, or tokenized now (by ``workers`` processes) and
    cached. ``show``: this process reports (rank 0: a cache hit, a wait for another process); whichever process
    tokenizes says so and shows its progress. ``log``: where the one-line notes go."""
    from autosp.compiler.data.documents import data_kind
    from autosp.compiler.data.identity import data_identity

    data_kind(path, flag)  # missing path, unknown extension, empty file: before anything else
    key = cache_key(data_identity(path), tokenizer_fingerprint(tokenizer), text_field)
    root = cache_root()
    directory = os.path.join(root, key)
    entry = _entry(directory, key, cached=True)
    if entry is None:
        def waiting():
            if show:
                log(f"autosp-train: waiting for another process tokenizing {path} (it holds "
                    f"{os.path.join(root, f'.{key}.lock')}; it shows the progress)", flush=True)

        with building(root, key, waiting) as build:
            entry = _entry(directory, key, cached=True)  # the process we waited for built it
            if entry is None:
                failed = build.failed_meanwhile()
                if failed:
                    raise UsageError(failed)
                try:
                    return _build(path, text_field, tokenizer, build, directory, flag, workers, log)
                except UsageError as err:
                    build.record_failure(str(err))
                    raise
                except Exception as err:
                    build.record_failure(f"tokenizing {path} failed in another process: {one_line(err, 300)}")
                    raise
    if show:
        log(f"autosp-train: {describe(path, entry)}, read from the token cache {directory}", flush=True)
    return entry


__all__ = ["FORMAT", "TokenizedData", "cache_key", "cache_root", "describe", "load_tokenizer", "tokenized",
           "tokenizer_fingerprint"]
