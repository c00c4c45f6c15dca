"""Text data for ``autosp-train --data``: documents read with the ``datasets`` library, tokenized once
(cached) into memory-mapped token files, EOS-separated and packed into ``--ctx`` sequences trained document
by document.

- :mod:`.documents` reads the documents: ``.jsonl`` (the ``--text-field`` of every line), ``.txt``
  (paragraphs: runs of lines separated by blank or whitespace-only lines), ``.parquet`` (the ``--text-field``
  column) or a directory written by ``datasets.Dataset.save_to_disk``, into Arrow files on disk;
- :mod:`.tokenizing` tokenizes them with ``datasets``' ``map(batched=True, num_proc=--data-workers)``, window by
  window, straight into ``tokens.bin`` / ``starts.bin`` (memory that does not grow with the corpus);
- :mod:`.tokens` loads the ``--tokenizer`` (a Hugging Face tokenizer directory; default: the model's) and
  returns the tokenized data, from the cache :mod:`.cache` keeps (keyed by the files' size, mtime and sampled
  bytes, :mod:`.identity`, and the tokenizer's fingerprint), or tokenized now by one process while the others
  wait on a file lock;
- :mod:`.sources` turns the token stream into batches: every batch is a pure function of (seed, micro-step
  index), which is what a resumed run needs to see the batches the uninterrupted run saw.
"""

TEXT_SUFFIXES = (".jsonl", ".json", ".txt", ".parquet")
"""``--data`` paths read as text (a directory is read as a ``save_to_disk`` dataset)."""


def is_text_data(path: str) -> bool:
    """Whether ``--data path`` names text (tokenized by autosp) rather than a token file."""
    import os

    return os.path.isdir(path) or os.path.splitext(path)[1].lower() in TEXT_SUFFIXES


__all__ = ["TEXT_SUFFIXES", "is_text_data"]
