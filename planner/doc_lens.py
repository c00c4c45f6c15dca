"""The packed-document workload of a request: ``--doc-lens FILE`` or ``--mean-doc-len N``, as a histogram.

``--doc-lens FILE`` takes the document lengths (in tokens, separators included) of the dataset, in one of
three forms, told apart by the file's first non-blank character:

- text: one length per line (or any whitespace between lengths), e.g. what
  ``python -c "print(*(len(x) for x in token_lists), sep='\\n')"`` writes; ``#`` starts a comment;
- a JSON list of lengths: ``[812, 15034, 2210, ...]``;
- a JSON object, a histogram ``{"length": count, ...}``, e.g. ``json.dump(collections.Counter(lengths), f)``
  (keys are lengths, values how many documents have that length).

``--mean-doc-len N`` assumes every document has exactly N tokens. For a given mean, equal lengths are the
cheapest attention there is (the sum of squared lengths is smallest), so with a spread of lengths the
real step is slower: give ``--doc-lens`` when you have the lengths.

Either becomes ``Workload.doc_lens``: ((length, count), ...), binned past
:data:`~autosp.cost_models.documents.MAX_BINS` distinct lengths (cost_models/documents.py). Every
problem is a one-line :class:`~autosp.errors.UsageError`.
"""

from __future__ import annotations

import os

from autosp.cost_models.documents import compact_histogram
from autosp.errors import UsageError
from autosp.files import read_text
from autosp.units import MAX_TOKENS, _parse_scaled

__all__ = ["FORMATS", "histogram_of", "mean_histogram", "read_doc_lens"]

FORMATS = ("a text file with one length per line, a JSON list of lengths, or a JSON object {length: count}")


def _length(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise UsageError(f"{where}: {value!r} is not a document length (a positive integer of tokens)")
    if value < 1:
        raise UsageError(f"{where}: document lengths must be positive, got {value}")
    if value > MAX_TOKENS:
        raise UsageError(f"{where}: a document of {value:,} tokens is larger than the supported maximum "
                         f"{MAX_TOKENS:,}")
    return value


def histogram_of(value, where: str = "--doc-lens") -> tuple:
    """((length, count), ...) of a list of lengths, a {length: count} mapping or (length, count) pairs."""
    counts: dict[int, int] = {}
    if isinstance(value, dict):
        for key, count in value.items():
            length = _length(key, where)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UsageError(f"{where}: the count of length {key} must be a non-negative integer, got {count!r}")
            counts[length] = counts.get(length, 0) + count
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (list, tuple)):
                if len(item) != 2:
                    raise UsageError(f"{where}: {item!r} is neither a length nor a (length, count) pair")
                length, count = _length(item[0], where), item[1]
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise UsageError(f"{where}: the count of length {length} must be a non-negative integer, "
                                     f"got {count!r}")
                counts[length] = counts.get(length, 0) + count
            else:
                length = _length(item, where)
                counts[length] = counts.get(length, 0) + 1
    else:
        raise UsageError(f"{where} must be {FORMATS}; got {type(value).__name__}")
    if not any(counts.values()):
        raise UsageError(f"{where} holds no documents; it must list document lengths ({FORMATS})")
    return compact_histogram(counts)


def read_doc_lens(path) -> tuple:
    """The histogram in the file ``path`` (one of :data:`FORMATS`)."""
    import json

    where = f"--doc-lens {os.fspath(path)}"
    text = read_text(path, "--doc-lens file ")
    stripped = text.lstrip()
    if not stripped:
        raise UsageError(f"{where} is empty; it must list document lengths ({FORMATS})")
    if stripped[0] in "[{":
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, ValueError) as err:
            line = f" (line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
            raise UsageError(f"{where} is not valid JSON{line}: {getattr(err, 'msg', err)}") from None
        except RecursionError:
            raise UsageError(f"{where} nests JSON too deeply to be a list of lengths") from None
        return histogram_of(value, where)
    counts: dict[int, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for word in line.split("#", 1)[0].split():
            if not word.isdigit():
                raise UsageError(f"{where} line {number}: {word!r} is not a document length (a positive integer "
                                 f"of tokens); the file must be {FORMATS}")
            length = _length(int(word), f"{where} line {number}")
            counts[length] = counts.get(length, 0) + 1
    if not counts:
        raise UsageError(f"{where} holds no documents; it must list document lengths ({FORMATS})")
    return compact_histogram(counts)


def mean_histogram(value) -> tuple:
    """``--mean-doc-len N`` (suffixes as for --ctx: 16k, 4Ki): every document N tokens long."""
    return ((_parse_scaled(value, "--mean-doc-len", allow_suffix=True), 1),)
