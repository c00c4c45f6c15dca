"""Memory over time in a recorded training step: when each storage is alive (spans), the live bytes over
an interval and their peak, and the memory traffic of a region of fused pointwise ops."""

from __future__ import annotations


def alive_spans(tr, include, t0: int, t1: int) -> list:
    """(alloc, free, nbytes, is_trace_dtype) of the storages satisfying include(sid) alive in [t0, t1]."""
    spans = []
    end = len(tr.ops) + 1
    for sid, st in tr.storages.items():
        if not include(sid):
            continue
        free = st.free if st.free >= 0 else end
        if st.alloc <= t1 and free > t0:
            spans.append((st.alloc, free, st.nbytes, st.dtype == tr.dtype))
    return spans


def live_curve(tr, include, t0: int, t1: int, extra=(), spans=None):
    """Bytes alive after each op t in [t0, t1] among the storages for which include(sid) holds (or the
    precomputed ``spans``), plus the ``extra`` spans (alloc, free, nbytes, is_trace_dtype); split
    (trace-dtype bytes, other bytes). Returns [(t, dtype_bytes, other_bytes), ...]."""
    if spans is None:
        spans = alive_spans(tr, include, t0, t1)
    n = t1 - t0 + 2
    de, do = [0] * n, [0] * n
    for a, f, nbytes, is_e in list(spans) + list(extra):
        lo, hi = max(a, t0), min(f, t1 + 1)
        if lo >= hi:
            continue
        d = de if is_e else do
        d[lo - t0] += nbytes
        d[hi - t0] -= nbytes
    curve, e, o = [], 0, 0
    for i in range(n - 1):
        e += de[i]
        o += do[i]
        curve.append((t0 + i, e, o))
    return curve


def consumers_of(tr) -> dict:
    """storage id -> indices of the ops that read it."""
    out: dict = {}
    for o in tr.ops:
        for sid in o.ins:
            out.setdefault(sid, []).append(o.idx)
    return out


def fused_traffic(tr, region_ops, consumers) -> float:
    """Bytes the pointwise ops ``region_ops`` move if every connected chain of them runs as one fused
    kernel (as Inductor does): each chain reads the tensors it gets from outside once and writes the
    tensors that leave it (read by an op outside the chain, saved for backward) once; what stays inside
    a chain never touches memory. Eager PyTorch instead moves every op's inputs and outputs
    (``Op.rw_bytes``)."""
    region = {o.idx: o for o in region_ops}
    parent = {i: i for i in region}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for o in region_ops:
        for sid in o.ins:
            st = tr.storages.get(sid)
            if st is not None and st.producer in region:
                parent[find(o.idx)] = find(st.producer)
    reads: dict = {}
    writes: dict = {}
    for o in region_ops:
        comp = find(o.idx)
        for sid, nbytes in zip(o.ins, o.in_bytes):
            st = tr.storages.get(sid)
            if st is None or st.producer in region and find(st.producer) == comp:
                continue
            key = (comp, sid)
            reads[key] = max(reads.get(key, 0), nbytes)
        for sid in o.new:
            users = consumers.get(sid, ())
            if sid in tr.saved or any(u not in region or find(u) != comp for u in users):
                writes[(comp, sid)] = tr.storages[sid].nbytes
    return float(sum(reads.values()) + sum(writes.values()))


def alive_before(tr, include, t: int) -> tuple[int, int]:
    """(trace-dtype bytes, other bytes) allocated before op t and still alive during it: what a phase
    starting at t inherits (a temporary freed by op t itself is not inherited)."""
    e = o = 0
    for a, f, n, is_e in alive_spans(tr, include, t, t):
        if a < t and f > t:
            if is_e:
                e += n
            else:
                o += n
    return e, o


def peak(curve):
    return max(curve, key=lambda c: c[1] + c[2])


__all__ = ["alive_before", "alive_spans", "consumers_of", "fused_traffic", "live_curve", "peak"]
