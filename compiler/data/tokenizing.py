"""Tokenizing a corpus with ``datasets.map`` straight into token files, in memory that does not grow with it.

The documents (:class:`~autosp.compiler.data.documents.Documents`, Arrow files on disk) are tokenized window
by window: each window is a fresh memory map of about :data:`WINDOW_BYTES` of text per worker, tokenized by
``Dataset.map(batched=True, num_proc=workers)`` into Arrow files of token ids (one list per document, EOS
appended), which are then streamed, a record batch at a time, onto the end of two flat files:

- ``tokens.bin``: every document's ids, ``int32``, in the data's order;
- ``starts.bin``: ``int64`` offsets of every document in ``tokens.bin``, then its length.

A window's map and its outputs are released before the next one, so the resident memory is a window's
(the memory-mapped pages a window read, the workers' batches), whatever the corpus size
(``studies/tokenize_memory.py`` measures it). ``map`` splits a window into contiguous shards, one per worker,
and returns them in order, so the files are the same byte for byte at any number of workers.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

TOKEN_DTYPE = np.int32
START_DTYPE = np.int64

WINDOW_BYTES = 64 << 20
"""Text per worker per window: large enough that starting the workers costs little next to the window's
tokenizing (tens of seconds at a few MB/s per core), small enough that its memory-mapped pages stay tens of MB."""

MIN_WORKER_BYTES = 4 << 20
"""No more workers than one per this much text: starting a worker costs about a second, which a small corpus
would not win back."""

BATCH_DOCUMENTS = 1000
"""Documents per tokenizer call (a fast tokenizer parallelises within a call)."""

NOTE_EVERY_S = 30.0
"""Off a terminal (a job's log), a progress line at most this often instead of a redrawn bar."""


@dataclass(frozen=True)
class Counts:
    documents: int  # written (not empty)
    skipped: int  # empty or blank documents, not written
    tokens: int


def workers_for(nbytes: int, requested: int) -> int:
    """The workers worth starting for ``nbytes`` of documents: at most ``requested``, one per
    :data:`MIN_WORKER_BYTES`."""
    return max(1, min(requested, nbytes // MIN_WORKER_BYTES))


def _encode(texts, tokenizer, eos):
    """One batch of documents -> their ids, each ended by EOS; empty and blank documents dropped."""
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        return {"input_ids": []}
    ids = tokenizer(texts, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return {"input_ids": [x if x and x[-1] == eos else list(x) + [eos] for x in ids]}


class Progress:
    """Documents done: a tqdm bar on a terminal, a line every :data:`NOTE_EVERY_S` seconds otherwise."""

    def __init__(self, total: int, what: str, log):
        self.total, self.what, self.log, self.done = total, what, log, 0
        self.start = self.noted = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=f"tokenizing {what}", unit="doc", file=sys.stderr, mininterval=1.0)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.noted >= NOTE_EVERY_S and self.done < self.total:
            self.noted = time.monotonic()
            rate = self.done / max(self.noted - self.start, 1e-9)
            self.log(f"autosp-train: tokenizing {self.what}: {self.done:,} of {self.total:,} documents "
                     f"({100 * self.done / self.total:.0f}%, {rate:,.0f}/s)", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _append(map_files, tokens_out, starts_out, offset: int) -> tuple[int, int]:
    """Stream ``map``'s output files onto the token and start files; returns (documents, new offset)."""
    import pyarrow as pa

    documents = 0
    for name in map_files:
        with pa.OSFile(name) as source:  # read(), not a memory map: each batch is freed after it is written
            for batch in pa.ipc.open_stream(source):
                column = batch.column(0)
                if not len(column):
                    continue
                lengths = np.diff(np.asarray(column.offsets)).astype(START_DTYPE)
                tokens_out.write(np.asarray(column.flatten(), dtype=TOKEN_DTYPE).tobytes())
                starts = offset + np.concatenate([[0], np.cumsum(lengths[:-1])])
                starts_out.write(starts.astype(START_DTYPE).tobytes())
                offset += int(lengths.sum())
                documents += len(column)
        os.remove(name)
    return documents, offset


def write_token_files(documents, tokenizer, directory: str, work: str, workers: int, progress: Progress) -> Counts:
    """Tokenize ``documents`` into ``directory``/tokens.bin and starts.bin (``work``: scratch for ``map``)."""
    from autosp.compiler.data.documents import datasets_library

    datasets = datasets_library()
    if workers > 1:  # the workers are the parallelism; tokenizers' own threads would only oversubscribe
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    per_window = max(1, int(documents.rows * WINDOW_BYTES * workers / max(documents.nbytes, 1)))
    written = offset = 0
    with open(os.path.join(directory, "tokens.bin"), "wb") as tokens_out, \
            open(os.path.join(directory, "starts.bin"), "wb") as starts_out:
        for index, first in enumerate(range(0, documents.rows, per_window)):
            last = min(first + per_window, documents.rows)
            window = documents.window(first, last)
            mapped = window.map(_encode, batched=True, batch_size=BATCH_DOCUMENTS, input_columns=[documents.column],
                                remove_columns=[documents.column], fn_kwargs={"tokenizer": tokenizer,
                                                                              "eos": tokenizer.eos_token_id},
                                features=features, num_proc=workers if workers > 1 and last - first > 1 else None,
                                cache_file_name=os.path.join(work, f"window{index}.arrow"),
                                new_fingerprint=f"autosp-window-{index}", load_from_cache_file=False)
            files = [c["filename"] for c in mapped.cache_files]
            del mapped, window
            gc.collect()  # unmap the window's input and output before reading the next
            count, offset = _append(files, tokens_out, starts_out, offset)
            written += count
            progress.update(last - first)
        starts_out.write(np.asarray([offset], dtype=START_DTYPE).tobytes())
        for f in (tokens_out, starts_out):
            f.flush()
            os.fsync(f.fileno())
    return Counts(documents=written, skipped=documents.rows - written, tokens=offset)


__all__ = ["BATCH_DOCUMENTS", "Counts", "MIN_WORKER_BYTES", "Progress", "START_DTYPE", "TOKEN_DTYPE", "WINDOW_BYTES",
           "workers_for", "write_token_files"]
