"""Admission rules of a candidate that hold whatever the model and cluster: the planner's search space refuses a
candidate that breaks one (:func:`autosp.planner.search.space.invalid_reason`) and the compiler refuses a hand-made one
(:func:`autosp.compiler.api.resolve_candidate`), with the same words. The rules that need the model or the
cluster (heads, node sizes, tiles per rank) are the planner's alone; the Candidate's own field checks are in
:class:`autosp.contract.specs.Candidate`.
"""

from __future__ import annotations


def chunks_overlap_reason(sequence_chunks: int, overlap: str) -> str | None:
    """Why sequence chunks cannot go with this overlap schedule, or None."""
    if sequence_chunks > 1 and overlap == "head_pipeline":
        return ("overlap=head_pipeline splits each layer's attention into head groups, and sequence_chunks needs one "
                "attention per layer; use overlap=none or kv_async with sequence_chunks > 1")
    return None


def overlap_reason(overlap: str, ulysses: int) -> str | None:
    """Why an all-to-all overlap schedule cannot apply with a Ulysses degree of ``ulysses``, or None."""
    if overlap != "none" and ulysses == 1:
        return (f"overlap={overlap} overlaps the Ulysses all-to-alls and needs an all-to-all (a Ulysses degree "
                f"sp / ring > 1; ring attention overlaps its own transfers); use overlap=none")
    return None


def candidate_reason(cand) -> str | None:
    """The first model-free rule ``cand`` breaks, as one line, or None."""
    return chunks_overlap_reason(cand.sequence_chunks, cand.overlap) or overlap_reason(cand.overlap, cand.ulysses)


__all__ = ["candidate_reason", "chunks_overlap_reason", "overlap_reason"]
