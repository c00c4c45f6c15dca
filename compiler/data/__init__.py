"""Text data for ``autosp-train --data``: documents read with the ``datasets`` library, tokenized once
(cached), EOS-separated and packed into ``--ctx`` sequences trained document by document.

- :mod:`.documents` reads the documents: ``.jsonl`` (the ``--text-field`` of every line), ``.txt``
  (paragraphs: blocks separated by blank lines), ``.parquet`` (the ``--text-field`` column) or a directory
  written by ``datasets.Dataset.save_to_disk``; and fingerprints their bytes;
- :mod:`.tokens` loads the ``--tokenizer`` (a Hugging Face tokenizer directory; default: the model's),
  tokenizes every document with a progress bar and caches the result, keyed by the content's and the
  tokenizer's fingerprints, so the next run reads the cache instead;
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
