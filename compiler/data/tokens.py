"""Tokenizing documents once: the tokenizer, its fingerprint, and the token cache.

A run tokenizes every document (``add_special_tokens`` as the tokenizer's defaults say: Llama's adds
BOS), appends the tokenizer's EOS to each (unless it already ends with it), and stores the concatenated
ids and the document boundaries. The result is cached under ``$AUTOSP_DATA_CACHE`` (else
``$XDG_CACHE_HOME/autosp/tokens``, else ``~/.cache/autosp/tokens``) in a directory named by the sha256 of
the data's bytes, the tokenizer's fingerprint, the text field and :data:`FORMAT`; the names of the files
play no part, so a renamed copy hits and an edited file misses. The directory appears by one atomic
rename after its files are written and flushed: a run killed while tokenizing leaves no cache entry,
and concurrent processes (every rank of a torchrun job) take a file lock so one tokenizes and the rest
read its result.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from autosp.errors import UsageError
from autosp.messages import install_hint, one_line

FORMAT = "autosp-tokens-1"
"""Bump when what a cache entry holds changes (old entries are then ignored)."""

BATCH_DOCUMENTS = 1000
"""Documents per tokenizer call (the fast tokenizer parallelises within a batch)."""


def cache_root() -> str:
    override = os.environ.get("AUTOSP_DATA_CACHE")
    if override:
        return os.path.expanduser(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autosp", "tokens")


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
    every document, then the stream's length)."""

    tokens: np.ndarray
    starts: np.ndarray
    key: str
    cached: bool  # read from the cache (not tokenized by this call)
    path: str

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


def cache_key(content: str, tokenizer_fp: str, text_field: str) -> str:
    return hashlib.sha256(json.dumps([FORMAT, content, tokenizer_fp, text_field]).encode()).hexdigest()[:32]


def _read_entry(directory: str, key: str, path: str) -> TokenizedData | None:
    try:
        tokens = np.load(os.path.join(directory, "tokens.npy"), mmap_mode="r")
        starts = np.load(os.path.join(directory, "starts.npy"))
    except (OSError, ValueError):
        return None
    if starts.size < 2 or int(starts[-1]) != tokens.size:
        return None
    return TokenizedData(tokens=tokens, starts=starts, key=key, cached=True, path=directory)


def _tokenize(documents, tokenizer, show: bool, what: str) -> tuple[np.ndarray, np.ndarray]:
    from tqdm.auto import tqdm

    eos = tokenizer.eos_token_id
    pieces, lengths = [], []
    bar = tqdm(total=len(documents), desc=f"tokenizing {what}", unit="doc", disable=not show, file=sys.stderr,
               mininterval=1.0)
    for first in range(0, len(documents), BATCH_DOCUMENTS):
        texts = [t for t in documents[first:first + BATCH_DOCUMENTS]["text"] if t and t.strip()]
        if texts:
            for ids in tokenizer(texts)["input_ids"]:
                if not ids or ids[-1] != eos:
                    ids = list(ids) + [eos]
                pieces.append(np.asarray(ids, dtype=np.int64))
                lengths.append(len(ids))
        bar.update(min(BATCH_DOCUMENTS, len(documents) - first))
    bar.close()
    if not pieces:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return np.concatenate(pieces), starts


def _write_entry(directory: str, tokens: np.ndarray, starts: np.ndarray, meta: dict) -> None:
    """Write the entry beside its final place and rename it there in one step."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
    try:
        dtype = np.uint32 if tokens.size == 0 or int(tokens.max()) < 2**32 else np.int64
        for name, array in (("tokens.npy", tokens.astype(dtype)), ("starts.npy", starts)):
            with open(os.path.join(tmp, name), "wb") as f:
                np.save(f, array)
                f.flush()
                os.fsync(f.fileno())
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        os.rename(tmp, directory)
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def tokenized(path: str, text_field: str, tokenizer, *, show: bool = True, flag: str = "--data",
              log=print) -> TokenizedData:
    """The tokenized documents of ``path``: from the cache, or tokenized now and cached. ``show``: print
    (rank 0); ``log``: where the one-line notes go."""
    from autosp.compiler.data.documents import content_fingerprint, data_kind, load_documents

    data_kind(path, flag)  # missing path, unknown extension, empty file: before hashing anything
    key = cache_key(content_fingerprint(path), tokenizer_fingerprint(tokenizer), text_field)
    root = cache_root()
    directory = os.path.join(root, key)
    entry = _read_entry(directory, key, path)
    if entry is None:
        try:
            os.makedirs(root, exist_ok=True)
            lock = open(os.path.join(root, f".{key}.lock"), "w")
        except OSError as err:
            raise UsageError(f"cannot write the token cache {root}: {err.strerror or err} (set AUTOSP_DATA_CACHE to "
                             "a writable directory)") from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be tokenizing the same data
            entry = _read_entry(directory, key, path)
            if entry is None:
                documents = load_documents(path, text_field, flag)
                if show:
                    log(f"autosp-train: tokenizing {len(documents):,} documents of {path} once (cached for the next "
                        f"runs in {directory})", flush=True)
                start = time.perf_counter()
                tokens, starts = _tokenize(documents, tokenizer, show, os.path.basename(path.rstrip("/")))
                if tokens.size == 0:
                    raise UsageError(f"{flag} {path} holds no text (every document is empty)")
                try:
                    _write_entry(directory, tokens, starts, {"format": FORMAT, "documents": len(starts) - 1,
                                                             "tokens": int(tokens.size), "source": os.path.abspath(path),
                                                             "seconds": round(time.perf_counter() - start, 3)})
                except OSError as err:
                    raise UsageError(f"cannot write the token cache {root}: {err.strerror or err} (set "
                                     "AUTOSP_DATA_CACHE to a writable directory)") from None
                entry = _read_entry(directory, key, path)
                return TokenizedData(entry.tokens, entry.starts, key, False, directory)
    if show:
        log(f"autosp-train: {path}: {entry.documents:,} documents, {entry.tokens.size:,} tokens, read from the token "
            f"cache {directory}", flush=True)
    return entry


__all__ = ["FORMAT", "TokenizedData", "cache_key", "cache_root", "load_tokenizer", "tokenized", "tokenizer_fingerprint"]
