"""Reading documents with the ``datasets`` library into memory-mapped Arrow files.

Formats (by ``--data``'s extension; a directory is a dataset written by ``Dataset.save_to_disk``):

- ``.jsonl`` / ``.json``: JSON Lines (or a JSON array) of objects; the document is the ``--text-field``
  string of each (``datasets``' ``json`` builder);
- ``.txt``: plain text whose documents are paragraphs: runs of lines separated by one or more blank lines,
  a line that holds only spaces or tabs counting as blank (a document is its lines joined by ``\\n``);
- ``.parquet``: the ``--text-field`` column;
- a ``save_to_disk`` directory: its ``--text-field`` column (a ``DatasetDict`` needs its ``train`` split).

Text files are converted to Arrow files under a scratch directory the caller owns (on disk, written in
batches by ``datasets``: never the whole corpus in memory); a ``save_to_disk`` directory is read in place.
:class:`Documents` names those files, which the tokenizer opens window by window
(:mod:`autosp.compiler.data.tokenizing`). Every failure is one :class:`~autosp.errors.UsageError` line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from autosp.errors import UsageError
from autosp.messages import install_hint, one_line


def datasets_library():
    try:
        import datasets
    except ImportError:
        raise UsageError(f"reading text data needs the datasets library: {install_hint('train')}") from None
    datasets.disable_progress_bars()  # the tokenizing process draws its own bar (autosp.compiler.data.tokenizing)
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


@dataclass(frozen=True)
class Documents:
    """The documents of a ``--data`` path: column ``column`` of the Arrow ``files`` (in order), ``rows`` rows
    (empty documents included: the tokenizer skips them), ``nbytes`` the files' size."""

    files: tuple[str, ...]
    column: str
    rows: int
    nbytes: int

    def window(self, start: int, stop: int):
        """Rows ``[start, stop)`` as a ``datasets.Dataset`` on a fresh memory map of the files: once it is
        dropped, the pages it read leave this process's resident memory (a map held for the whole corpus
        would keep every page it touched resident, growing with the corpus)."""
        datasets = datasets_library()
        parts = [datasets.Dataset.from_file(f) for f in self.files]
        table = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        return table.select_columns([self.column]).select(range(start, stop))


def paragraphs(path: str):
    """The paragraphs of a text file, one ``{"text": ...}`` at a time (a generator for ``datasets``)."""
    lines = []
    with open(path, encoding="utf-8") as f:  # text mode: \r\n and \r read as \n
        for line in f:
            if line.strip():
                lines.append(line.rstrip("\n"))
            elif lines:
                yield {"text": "\n".join(lines)}
                lines = []
    if lines:
        yield {"text": "\n".join(lines)}


def json_error(path: str) -> str | None:
    """Where ``path`` stops being JSON Lines (or a JSON array): ``line N: <the parser's message>``, or
    None if every line parses as an object. Read line by line: only called once reading has failed."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        try:
            with open(path, encoding="utf-8-sig") as f:
                rows = json.load(f)
        except json.JSONDecodeError as err:
            return f"line {err.lineno} column {err.colno}: {err.msg}"
        except UnicodeDecodeError as err:
            return f"not UTF-8 text ({err.reason} at byte {err.start})"
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        return None if bad is None else f"item {bad + 1} of the array is not a JSON object"
    with open(path, encoding="utf-8-sig", errors="strict") as f:
        number = 0
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as err:
                    return f"line {number} column {err.pos + 1}: {err.msg}"
                if not isinstance(row, dict):
                    return f"line {number} is a JSON {type(row).__name__}, not an object"
        except UnicodeDecodeError as err:
            return f"line {number + 1}: not UTF-8 text ({err.reason})"
    return None


def _innermost(err: BaseException) -> str:
    """The deepest cause's text: ``datasets`` wraps the reader's own message in a generic one."""
    while err.__cause__ is not None:
        err = err.__cause__
    return one_line(err, 200) or type(err).__name__


def _parquet_columns(path: str) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(path).names


def load_documents(path: str, text_field: str, scratch: str, flag: str = "--data") -> Documents:
    """The documents of ``path``; text files are converted to Arrow under ``scratch`` (which the caller
    removes once it has tokenized them)."""
    datasets = datasets_library()
    kind = data_kind(path, flag)
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its reader logs the failure we report in one line
    try:
        if kind == "disk":
            table = datasets.load_from_disk(path)
            if isinstance(table, datasets.DatasetDict):
                if "train" not in table:
                    raise UsageError(f"{flag} {path} is a DatasetDict without a 'train' split (it has "
                                     f"{', '.join(table) or 'none'})")
                table = table["train"]
            if table._indices is not None:  # a selection of another table: written out in order, once
                table = table.flatten_indices(cache_file_name=os.path.join(scratch, "flat.arrow"))
        elif kind == "txt":
            features = datasets.Features({"text": datasets.Value("string")})
            table = datasets.Dataset.from_generator(paragraphs, gen_kwargs={"path": path}, features=features,
                                                    cache_dir=scratch)
            text_field = "text"
        elif kind == "parquet":
            columns = _parquet_columns(path)
            if text_field not in columns:
                raise UsageError(f"{flag} {path} has no field {text_field!r} (it has {', '.join(columns) or 'none'}"
                                 f"); name the text with --text-field")
            table = datasets.Dataset.from_parquet(path, columns=[text_field], cache_dir=scratch)
        else:
            table = datasets.Dataset.from_json(path, cache_dir=scratch)
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - malformed JSON, not parquet, truncated arrow: one line each
        where = json_error(path) if kind == "jsonl" else None
        if where is not None:
            raise UsageError(f"{flag} {path} cannot be read as jsonl: {where}") from None
        raise UsageError(f"{flag} {path} cannot be read as {kind}: {_innermost(err)}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if text_field not in table.column_names:
        raise UsageError(f"{flag} {path} has no field {text_field!r} (it has {', '.join(table.column_names) or 'none'}"
                         f"); name the text with --text-field")
    feature = table.features[text_field]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UsageError(f"{flag} {path}: field {text_field!r} holds {feature}, not text")
    files = tuple(c["filename"] for c in table.cache_files)
    if len(table) and not files:  # held in memory by datasets (not expected for the readers above)
        table = table.flatten_indices(cache_file_name=os.path.join(scratch, "flat.arrow"))
        files = tuple(c["filename"] for c in table.cache_files)
    return Documents(files=files, column=text_field, rows=len(table),
                     nbytes=sum(os.path.getsize(f) for f in files))


__all__ = ["Documents", "data_kind", "datasets_library", "json_error", "load_documents", "paragraphs"]
