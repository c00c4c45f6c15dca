"""Reading documents with the ``datasets`` library, and fingerprinting what was read.

Formats (by ``--data``'s extension; a directory is a dataset written by ``Dataset.save_to_disk``):

- ``.jsonl`` / ``.json``: JSON Lines (or a JSON array) of objects; the document is the ``--text-field``
  string of each (``datasets``' ``json`` builder);
- ``.txt``: plain text whose documents are paragraphs, blocks separated by one or more blank lines
  (``datasets``' ``text`` builder with ``sample_by="paragraph"``);
- ``.parquet``: the ``--text-field`` column;
- a ``save_to_disk`` directory: its ``--text-field`` column (a ``DatasetDict`` needs its ``train`` split).

Empty documents are skipped. Every failure is one :class:`~autosp.errors.UsageError` line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from autosp.errors import UsageError
from autosp.messages import install_hint

FINGERPRINT_CHUNK = 1 << 20


def _datasets():
    try:
        import datasets
    except ImportError:
        raise UsageError(f"reading text data needs the datasets library: {install_hint('train')}") from None
    datasets.disable_progress_bars()  # its arrow-conversion bars would interleave with ours on every rank
    return datasets


def data_kind(path: str, flag: str = "--data") -> str:
    """``jsonl``, ``txt``, ``parquet`` or ``disk``; one line for a missing path or unknown extension."""
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such file or directory")
    if os.path.isdir(path):
        if not (os.path.isfile(os.path.join(path, "dataset_info.json"))
                or os.path.isfile(os.path.join(path, "dataset_dict.json"))):
            raise UsageError(f"{flag} {path} is a directory but not a dataset written by datasets' save_to_disk "
                             "(no dataset_info.json or dataset_dict.json in it)")
        return "disk"
    if not os.path.isfile(path):
        from autosp.files import file_kind

        raise UsageError(f"{flag} {path} is {file_kind(os.stat(path).st_mode)}, not a file of documents")
    suffix = os.path.splitext(path)[1].lower()
    kinds = {".jsonl": "jsonl", ".json": "jsonl", ".txt": "txt", ".parquet": "parquet"}
    if suffix not in kinds:
        raise UsageError(f"{flag} {path}: unknown data type {suffix or '(none)'!r}; use text (.jsonl, .txt, .parquet "
                         "or a save_to_disk directory) or token ids (.npy, .pt, .bin)")
    if os.path.getsize(path) == 0:
        raise UsageError(f"{flag} {path} is empty")
    return kinds[suffix]


def content_fingerprint(path: str) -> str:
    """sha256 of the bytes read (every file of a directory, with its relative name): the cache key's half
    that says *what* was tokenized, whatever the path is called."""
    digest = hashlib.sha256()
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    for file in files:
        if os.path.isdir(path):
            digest.update(os.path.relpath(file, path).encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(FINGERPRINT_CHUNK):
                digest.update(chunk)
        digest.update(b"\1")
    return digest.hexdigest()


def load_documents(path: str, text_field: str, flag: str = "--data"):
    """The documents of ``path`` as a ``datasets.Dataset`` with one string column, ``text``."""
    datasets = _datasets()
    kind = data_kind(path, flag)
    scratch = tempfile.mkdtemp(prefix="autosp-datasets-")  # datasets' arrow conversion, removed below
    try:
        try:
            if kind == "disk":
                table = datasets.load_from_disk(path)
                if isinstance(table, datasets.DatasetDict):
                    if "train" not in table:
                        raise UsageError(f"{flag} {path} is a DatasetDict without a 'train' split (it has "
                                         f"{', '.join(table) or 'none'})")
                    table = table["train"]
            elif kind == "txt":
                table = datasets.Dataset.from_text(path, sample_by="paragraph", cache_dir=scratch,
                                                   keep_in_memory=True)
                text_field = "text"
            elif kind == "parquet":
                table = datasets.Dataset.from_parquet(path, cache_dir=scratch, keep_in_memory=True)
            else:
                table = datasets.Dataset.from_json(path, cache_dir=scratch, keep_in_memory=True)
        except UsageError:
            raise
        except Exception as err:  # noqa: BLE001 - malformed JSON, not parquet, truncated arrow: one line each
            text = str(err).strip().splitlines()
            raise UsageError(f"{flag} {path} cannot be read as {kind}: {(text[0] if text else type(err).__name__)[:200]}"
                             ) from None
        if text_field not in table.column_names:
            raise UsageError(f"{flag} {path} has no field {text_field!r} (it has {', '.join(table.column_names) or 'none'}"
                             f"); name the text with --text-field")
        feature = table.features[text_field]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise UsageError(f"{flag} {path}: field {text_field!r} holds {feature}, not text")
        table = table.select_columns([text_field])
        if text_field != "text":
            table = table.rename_column(text_field, "text")
        if len(table) and kind != "disk":
            table = table.flatten_indices()  # in memory: the scratch directory goes away
        return table
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["content_fingerprint", "data_kind", "load_documents"]
