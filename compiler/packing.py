"""``autosp-train --data FILE --doc-sep ID``: a token file of documents packed into sequences.

The file is one stream of token ids in which a separator id (an end-of-sequence token: ``--doc-sep ID``,
or ``--doc-sep eos`` for the Hugging Face config's ``eos_token_id``, every one of them when it is a list)
ends every document; the separator belongs to the document it ends (the model learns to emit it).

Each sequence is ``--ctx`` consecutive tokens of the stream, starting at the first document start at or
after a seeded random offset (a raw offset when no document starts in reach). Its documents are packed
the Hugging Face way (``DataCollatorWithFlattening``): ``position_ids`` restart at 0 at every document
start (and at the sequence start: a document cut by the window is trained from its cut), and the labels
are the token ids with -100 at every document's first token, so no target crosses a boundary. The engine
finds the documents from those ``position_ids`` and attention never crosses one.
"""

from __future__ import annotations

import numpy as np

from autosp.errors import UsageError


def pack_window(tokens, start: int, seq: int, separators) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input ids, position ids, labels), int64 arrays of ``seq``, for the tokens ``[start, start + seq)``."""
    ids = np.asarray(tokens[start:start + seq], dtype=np.int64)
    if ids.size != seq:
        raise ValueError(f"the window [{start}, {start + seq}) runs past the {len(tokens)} tokens")
    starts = np.zeros(seq, dtype=bool)
    starts[1:] = np.isin(ids[:-1], np.asarray(separators, dtype=np.int64))  # a token after a separator
    return pack_row(ids, starts)


def pack_row(ids: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input ids, position ids, labels) of one packed row whose documents start where ``starts`` (a bool
    array over the row) is true; the row's first token always starts one (a document cut by the row is
    trained from its cut). Shared by the token-file path and the text pipeline (autosp.compiler.data)."""
    seq = ids.size
    starts = starts.copy()
    starts[0] = True
    index = np.arange(seq)
    last_start = np.maximum.accumulate(np.where(starts, index, 0))
    positions = index - last_start
    labels = ids.copy()
    labels[starts] = -100
    return ids, positions, labels


def first_document_start(tokens, offset: int, seq: int, separators) -> int:
    """The first document start at or after ``offset`` leaving room for ``seq`` tokens, else ``offset``."""
    if offset == 0:
        return 0
    reach = np.asarray(tokens[offset - 1:offset - 1 + seq], dtype=np.int64)
    hits = np.nonzero(np.isin(reach, np.asarray(separators, dtype=np.int64)))[0]
    if hits.size and offset + int(hits[0]) + seq <= len(tokens):
        return offset + int(hits[0])
    return offset


def separators(doc_sep: str, hf_config: dict | None, vocab: int) -> tuple[int, ...]:
    """The separator ids ``--doc-sep`` names: an integer, or ``eos`` (the config's ``eos_token_id``)."""
    if doc_sep == "eos":
        eos = (hf_config or {}).get("eos_token_id")
        if eos is None:
            raise UsageError("--doc-sep eos needs a Hugging Face --model config with an eos_token_id; give the "
                             "separator id instead (--doc-sep ID)")
        ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    else:
        try:
            ids = (int(doc_sep),)
        except ValueError:
            raise UsageError(f"--doc-sep must be a token id or 'eos', got {doc_sep!r}") from None
    for sep in ids:
        if not 0 <= sep < vocab:
            raise UsageError(f"--doc-sep {sep} is not a token id of the model's vocabulary 0..{vocab - 1}")
    return ids


def check_separators(tokens, path: str, ids) -> None:
    if not bool(np.isin(np.asarray(tokens), np.asarray(ids, dtype=np.int64)).any()):
        raise UsageError(f"--data {path} never contains the document separator {', '.join(map(str, ids))}: "
                         f"check --doc-sep")


class PackedTokenSource:
    """Full batches of packed sequences, identical on every rank (seeded by step)."""

    def __init__(self, tokens, seq: int, seed: int, separators, torch):
        self.tokens, self.seq, self.seed, self.separators, self.torch = tokens, seq, seed, separators, torch

    def fingerprint(self) -> dict:
        """What decides every batch besides the micro-step index (a checkpoint records it)."""
        from autosp.compiler.data.identity import token_array_key

        return {"kind": "packed-token-file", "tokens_key": token_array_key(self.tokens), "seq": self.seq,
                "seed": self.seed, "separators": list(self.separators)}

    def batch(self, step: int, rows: int) -> dict:
        torch = self.torch
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        offsets = torch.randint(0, len(self.tokens) - self.seq + 1, (rows,), generator=gen).tolist()
        packed = [pack_window(self.tokens, first_document_start(self.tokens, o, self.seq, self.separators),
                              self.seq, self.separators) for o in offsets]
        ids, positions, labels = (torch.from_numpy(np.stack(parts)) for parts in zip(*packed))
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


__all__ = ["PackedTokenSource", "check_separators", "first_document_start", "pack_row", "pack_window", "separators"]
