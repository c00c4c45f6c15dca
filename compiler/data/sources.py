"""Batches of packed text, a pure function of (seed, micro-step index).

The tokenized documents (each ended by EOS, in the data's order) form one stream, cut into ``N =
ceil(T / ctx)`` consecutive sequences of ``ctx`` tokens; the last is right-padded (``pad_token_id``,
labels -100, ``attention_mask`` 0) when ``T`` is not a multiple of ``ctx``. Each sequence is packed the
Hugging Face way (:func:`autosp.compiler.packing.pack_row`): ``position_ids`` restart at 0 at every
document start -- taken from the stored document boundaries, not by searching for EOS, so an EOS id
inside a text cannot split it -- and at the sequence start (a document cut by a sequence boundary is
trained from its cut), labels are -100 at every document's first token. The engine trains every
document on its own.

Order. Micro-step ``m`` of ``R = dp x micro_batch`` rows takes the global sample indices ``m R ... m R
+ R - 1``; sample ``g`` is sequence ``perm_e[g mod N]`` of epoch ``e = g // N``, ``perm_e`` a permutation
drawn from ``(seed, e)`` alone. So every rank builds the same full batch, and micro-step ``m`` is the same
batch in a run resumed at ``m`` as in the uninterrupted run (the checkpoint records only ``m`` and
:meth:`PackedTextSource.fingerprint`). Evaluation (:meth:`PackedTextSource.eval_batch`) reads the
sequences in order, without shuffling, and pads the last batch with empty rows (no real token, no target).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from autosp.compiler.packing import pack_row

IGNORE = -100


class PackedTextSource:
    """Packed ``seq``-token sequences of a :class:`~autosp.compiler.data.tokens.TokenizedData`."""

    def __init__(self, data, seq: int, seed: int, pad_token_id: int, torch, *, shuffle: bool = True):
        self.data, self.seq, self.seed, self.pad, self.torch, self.shuffle = data, seq, seed, pad_token_id, torch, shuffle
        self.sequences = -(-int(data.tokens.size) // seq)
        self._perm = (None, None)

    # -- identity, for checkpoints ----------------------------------------------------------------------
    def fingerprint(self) -> dict:
        """What decides every batch besides the micro-step index: a resumed run must show the same."""
        return {"kind": "packed-text", "tokens_key": self.data.key, "seq": self.seq, "seed": self.seed,
                "shuffle": self.shuffle, "pad_token_id": self.pad, "sequences": self.sequences,
                "tokens": int(self.data.tokens.size)}

    def fingerprint_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.data.documents:,} documents, {int(self.data.tokens.size):,} tokens packed into "
                f"{self.sequences:,} sequences of {self.seq:,}")

    # -- rows -------------------------------------------------------------------------------------------
    def row(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, positions, labels, attention mask) of sequence ``index`` of the stream."""
        tokens, starts, seq = self.data.tokens, self.data.starts, self.seq
        a = index * seq
        b = min(a + seq, int(tokens.size))
        ids = np.full(seq, self.pad, dtype=np.int64)
        ids[:b - a] = np.asarray(tokens[a:b], dtype=np.int64)
        begins = np.zeros(seq, dtype=bool)
        # documents starting inside this sequence (starts is sorted and memory-mapped: a binary search reads a
        # few pages of it, not the whole array)
        inside = np.asarray(starts[np.searchsorted(starts, a, "right"):np.searchsorted(starts, b, "left")]) - a
        begins[inside] = True
        ids, positions, labels = pack_row(ids, begins)
        mask = np.ones(seq, dtype=np.int64)
        if b - a < seq:  # the stream's tail: pads continue the last document's positions, masked, no target
            real = b - a
            positions[real:] = positions[real - 1] + np.arange(1, seq - real + 1)
            labels[real:] = IGNORE
            mask[real:] = 0
        return ids, positions, labels, mask

    def _empty_row(self):
        seq = self.seq
        return (np.full(seq, self.pad, dtype=np.int64), np.arange(seq, dtype=np.int64),
                np.full(seq, IGNORE, dtype=np.int64), np.zeros(seq, dtype=np.int64))

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.sequences)
        if self._perm[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = (epoch, rng.permutation(self.sequences))
        return self._perm[1]

    def _stack(self, rows) -> dict:
        torch = self.torch
        ids, positions, labels, mask = (torch.from_numpy(np.stack(part)) for part in zip(*rows))
        batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
        if bool((mask == 0).any()):
            batch["attention_mask"] = mask
        return batch

    # -- batches ----------------------------------------------------------------------------------------
    def batch(self, step: int, rows: int) -> dict:
        """Micro-step ``step``'s full batch of ``rows`` sequences (every rank builds the same)."""
        out = []
        for g in range(step * rows, (step + 1) * rows):
            epoch, at = divmod(g, self.sequences)
            out.append(self.row(int(self._permutation(epoch)[at])))
        return self._stack(out)

    def eval_batches(self, rows: int) -> int:
        """How many batches of ``rows`` cover every sequence once."""
        return -(-self.sequences // rows)

    def eval_batch(self, index: int, rows: int) -> dict:
        """Evaluation batch ``index``: sequences ``index x rows ...`` in stream order, empty rows past the end."""
        out = [self.row(i) if i < self.sequences else self._empty_row()
               for i in range(index * rows, (index + 1) * rows)]
        return self._stack(out)


def batch_counts(batch: dict) -> tuple[int, int]:
    """(real tokens, targets) of a full batch: tokens not masked as padding, counted once whatever the SP
    and DP degrees; targets are the labels the model predicts (the shifted labels that are not -100)."""
    labels = batch["labels"]
    mask = batch.get("attention_mask")
    tokens = int(mask.sum()) if mask is not None else labels.numel()
    targets = int((labels[:, 1:] != IGNORE).sum())
    return tokens, targets


__all__ = ["PackedTextSource", "batch_counts"]
