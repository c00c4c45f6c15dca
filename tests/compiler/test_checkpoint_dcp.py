"""The DCP layer of checkpoints, without an engine: fragments at arbitrary global offsets, written by 2 gloo ranks
as ZeRO-1/2 cut them (a parameter split unevenly, one held wholly by one rank, one not at all by the other),
read back under other layouts (1, 3 and 4 ranks; even and ZeRO-3 partitions) by one process with no process
group; and each rank's share of a replicated tensor."""

from __future__ import annotations

import pytest

SIZES = {"a": 10, "b": 7, "c": 1}
# ZeRO-1/2 over a flat buffer a|b|c of 18 elements, 9 per rank: rank 0 holds a[0:9], rank 1 a[9:10], b, c
CUTS = ({"a": (0, 9)}, {"a": (9, 1), "b": (0, 7), "c": (0, 1)})


def _full(name):
    import torch

    return torch.arange(SIZES[name], dtype=torch.float32) + 100 * (ord(name) - ord("a"))


def _save(rank, world, directory):
    import io

    import torch
    import torch.distributed.checkpoint as dcp

    from autosp.compiler.training.dcp_planners import FlatSavePlanner

    state, fragments = {}, {}
    for name, (offset, length) in CUTS[rank].items():
        state[f"weight/{name}"] = _full(name)[offset:offset + length]
        fragments[f"weight/{name}"] = (SIZES[name], offset)
    blob = io.BytesIO()
    torch.save({"rank": rank}, blob)  # objects are stored as torch.save bytes (checkpoint.py)
    state[f"rng/rank-{rank:05d}"] = blob.getvalue()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory), planner=FlatSavePlanner(fragments))
    return sorted(__import__("os").listdir(directory))


@pytest.mark.slow
def test_fragments_written_by_2_ranks_read_under_any_layout(tmp_path):
    import torch

    from autosp.compiler.testing import spawn
    from autosp.compiler.training.checkpoint_read import Reader
    from autosp.compiler.training.engine_fragments import even_range

    directory = str(tmp_path / "ckpt")
    assert spawn(_save, 2, directory) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    reader = Reader(directory, {"version": 2})
    for world in (1, 3, 4):
        for rank in range(world):
            for layout in (even_range, _zero3):
                ranges = {name: layout(numel, rank, world) for name, numel in SIZES.items()}
                wants = {f"weight/{name}": (SIZES[name], offset, torch.full((length,), -1.0))
                         for name, (offset, length) in ranges.items() if length}
                reader.fill(wants)
                for key, (_, offset, buffer) in wants.items():
                    expected = _full(key.split("/")[1])[offset:offset + buffer.numel()]
                    assert torch.equal(buffer, expected), (world, rank, layout.__name__, key)
    assert reader.objects(["rng/rank-00001", "rng/rank-00007"]) == {"rng/rank-00001": {"rank": 1}}

    # a data file overwritten in place (same size, so meta.json's size check passes): the read fails with one
    # line, not DCP's per-rank tracebacks
    data = tmp_path / "ckpt" / "__1_0.distcp"
    data.write_bytes(bytes(data.stat().st_size))
    with pytest.raises(ValueError) as info:
        reader.fill({"weight/b": (7, 0, torch.empty(7))})
    assert "\n" not in str(info.value), str(info.value)


def _zero3(numel, rank, world):
    """DeepSpeed ZeRO-3's partition: ceil(numel / world) per rank, the last cut at numel."""
    size = -(-numel // world)
    start = min(numel, rank * size)
    return start, min(numel, start + size) - start


def test_every_rank_writes_an_even_share_of_a_replicated_tensor():
    from autosp.compiler.training.engine_fragments import even_range

    for numel in (0, 1, 5, 10, 4097):
        for world in (1, 2, 3, 4, 8):
            shares = [even_range(numel, r, world) for r in range(world)]
            assert sum(length for _, length in shares) == numel
            assert all(a + n == b for (a, n), (b, _) in zip(shares, shares[1:]) if n)  # contiguous, in rank order
            assert max(length for _, length in shares) <= -(-numel // world)
