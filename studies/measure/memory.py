"""Per-rank memory of one compiled SP training step, in the cost model's categories.

Three instruments, each exact for what it sees (no sampling):

- **Static census** (:func:`static_census`), at the start of a step: every tensor reachable from Python
  (``gc.get_objects()``), de-duplicated by storage, classified by who owns it: the module's parameters
  (ZeRO-3: their partitions ``ds_tensor`` plus what is gathered), the base optimizer's master weights
  (when they are a separate copy), their gradients, the Adam states, ZeRO's bucket buffers, and the rest.
- **Saved for backward** (:class:`SavedTensors`): ``torch.autograd.graph.saved_tensors_hooks`` around the
  forward, de-duplicated by storage. AOTAutograd's compiled function saves through
  ``ctx.save_for_backward``, so the hooks see exactly what the *compiled* graph keeps (after Inductor's
  min-cut partitioner chose what to recompute). Parameters saved by the graph are parameters, not
  activations; tensors whose last dimension is the vocabulary are the logits/loss side.
- **Dynamic peak** (:func:`attributed_peak`): CPU: ``torch.profiler`` with ``profile_memory=True`` around one
  step. c10's CPU allocator then reports every allocation and free with a running ``total_allocated``
  counter that counts only blocks allocated while profiling (frees of older blocks are ignored), so
  ``max(total_allocated) - total_allocated before the first event`` is the peak of the bytes the step
  itself allocated on top of what existed when it started. This sees allocations inside Inductor's
  generated code (which calls ``empty_strided`` below the dispatcher). GPU: ``torch.cuda.max_memory_allocated``
  minus ``memory_allocated`` at the start, after ``reset_peak_memory_stats``.

Peak allocated bytes of a rank = static census total + dynamic peak (what ``torch.cuda.max_memory_allocated``
reports on a GPU; it excludes the runtime itself, as the cost model's ``reserve`` does).
**Resident peak** (:func:`resident_peak`, CPU only): the kernel's high-water mark of the process's resident
set (``VmHWM``) over one step after resetting it (``/proc/self/clear_refs``): tensors + the Python/torch/
DeepSpeed runtime + what glibc keeps cached — the CPU analogue of CUDA's reserved memory plus context.

Why not ``torch.distributed._tools.mem_tracker.MemTracker``: it is a ``TorchDispatchMode``; with it active
Dynamo does not run the compiled graph (it falls back to eager), so it cannot observe the compiled SP
step at all — autosp's runtime then refuses the eager attention (it would attend over the local shard).
"""

from __future__ import annotations

import ctypes
import gc
import os
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensor

GIB = 1024 ** 3


def _storage_key(t: torch.Tensor):
    if t.device.type == "meta" or isinstance(t, FakeTensor):  # compile-time leftovers hold no memory
        return None, 0
    try:
        st = t.untyped_storage()
        return (t.device.type, st.data_ptr()), st.nbytes()
    except (RuntimeError, NotImplementedError):  # fake / meta / sparse tensors
        return None, 0


def _tensors_in(obj, depth: int = 3):
    """Tensors held by ``obj`` through lists, tuples, dicts and plain attributes (bounded depth)."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth <= 0:
        return
    if isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _tensors_in(item, depth - 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item, depth - 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)) and \
            type(obj).__module__.startswith("deepspeed"):
        for item in vars(obj).values():
            yield from _tensors_in(item, depth - 1)


def _base_optimizer(opt):
    """The torch optimizer doing the update (DeepSpeed's ZeRO optimizers wrap one as ``.optimizer``)."""
    seen = 0
    while opt is not None and not isinstance(opt, torch.optim.Optimizer) and seen < 4:
        opt = getattr(opt, "optimizer", None)
        seen += 1
    return opt if isinstance(opt, torch.optim.Optimizer) else None


def static_census(module: torch.nn.Module, optimizer, device: torch.device | None = None) -> dict:
    """Bytes alive now, by owner: ``parameters``, ``master_weights``, ``gradients``, ``optimizer_states``,
    ``zero_buffers`` (ZeRO's reduce/gather buckets and flat buffers that are not the above), ``other``
    (inputs, rotary tables, anything else reachable), plus ``total`` and ``zero_buffer_names``.

    ``device``: count only tensors on this kind of device (on a GPU the host-side tensors -- ZeRO-Offload's
    master weights and Adam states, pinned activation copies, the input batch -- are not device memory)."""
    gc.collect()
    owner: dict = {}
    size: dict = {}

    def claim(t, what):
        key, nbytes = _storage_key(t)
        if key is None or nbytes == 0 or (device is not None and key[0] != device.type):
            return
        size[key] = nbytes
        owner.setdefault(key, what)

    params = list(module.parameters())
    for p in params:
        ds = getattr(p, "ds_tensor", None)  # ZeRO-3 partition
        if ds is not None:
            claim(ds, "parameters")
        if p.numel():
            claim(p, "parameters")
    base = _base_optimizer(optimizer)
    if base is not None:
        for group in base.param_groups:
            for p in group["params"]:
                claim(p, "master_weights")  # a no-op when it is a parameter storage already claimed
                if p.grad is not None:
                    claim(p.grad, "gradients")
                for value in base.state.get(p, {}).values():
                    if isinstance(value, torch.Tensor):
                        claim(value, "optimizer_states")
    for p in params:
        if p.grad is not None:
            claim(p.grad, "gradients")
    names: dict = {}
    if optimizer is not None and optimizer is not base and hasattr(optimizer, "__dict__"):
        for name, value in vars(optimizer).items():
            for t in _tensors_in(value):
                key, _ = _storage_key(t)
                if key is not None and key not in owner:
                    lname = name.lower()
                    if "grad" in lname and "bucket" not in lname and "ipg" not in lname:
                        claim(t, "gradients")
                    else:
                        claim(t, "zero_buffers")
                        names[name] = names.get(name, 0) + size.get(key, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch module attributes warns
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                claim(obj, "other")
    out = {k: 0 for k in ("parameters", "master_weights", "gradients", "optimizer_states", "zero_buffers", "other")}
    for key, what in owner.items():
        out[what] += size[key]
    out["total"] = sum(size.values())
    out["zero_buffer_names"] = names
    return out


def live_storage_keys() -> dict:
    """{storage key: bytes} of every tensor reachable from Python now."""
    gc.collect()
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                key, nbytes = _storage_key(obj)
                if key is not None:
                    out[key] = nbytes
    return out


class SavedTensors:
    """Context manager: storages saved for backward during a forward, de-duplicated, classified.

    With ``device`` a GPU, tensors saved in host memory (activation offload's copies) are ``host``, not
    ``activations``: they hold no device memory."""

    def __init__(self, param_keys: set, vocab: int, device: torch.device | None = None):
        self.param_keys = param_keys
        self.vocab = vocab
        self.on_host_is_offloaded = device is not None and device.type != "cpu"
        self.saved: dict = {}

    def _pack(self, t):
        key, nbytes = _storage_key(t)
        if key is not None and key not in self.saved:
            if key in self.param_keys:
                kind = "parameters"
            elif self.on_host_is_offloaded and t.device.type == "cpu":
                kind = "host"
            elif t.dim() >= 1 and t.shape[-1] == self.vocab:
                kind = "logits_loss"
            else:
                kind = "activations"
            self.saved[key] = (nbytes, kind, tuple(t.shape), str(t.dtype).replace("torch.", ""))
        return t

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def summary(self) -> dict:
        out = {"activations": 0, "logits_loss": 0, "parameters": 0, "host": 0}
        shapes: dict = {}
        for nbytes, kind, shape, dtype in self.saved.values():
            out[kind] += nbytes
            if kind != "parameters":
                label = f"{kind}:{dtype}{list(shape)}"
                shapes[label] = shapes.get(label, 0) + 1
        out["tensors"] = dict(sorted(shapes.items(), key=lambda kv: -kv[1]))
        return out


def param_storage_keys(module: torch.nn.Module) -> set:
    keys = set()
    for p in module.parameters():
        for t in (p, getattr(p, "ds_tensor", None)):
            if t is not None and t.numel():
                key, _ = _storage_key(t)
                if key is not None:
                    keys.add(key)
    return keys


def _owned_ptrs(module, optimizer) -> dict:
    """Data pointers of the gradients and ZeRO buffers alive now: {"gradients": set, "zero_buffers": set}."""
    out = {"gradients": set(), "zero_buffers": set()}

    def add(kind, t):
        key, _ = _storage_key(t)
        if key is not None:
            out[kind].add(key[1])

    for p in module.parameters():
        if p.grad is not None:
            add("gradients", p.grad)
    base = _base_optimizer(optimizer)
    if base is not None:
        for group in base.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    add("gradients", p.grad)
    if optimizer is not None and optimizer is not base and hasattr(optimizer, "__dict__"):
        for name, value in vars(optimizer).items():
            lname = name.lower()
            for t in _tensors_in(value):
                if "ipg" in lname or "bucket" in lname or "buffer" in lname:
                    add("zero_buffers", t)
                elif "grad" in lname:
                    add("gradients", t)
    return out


def zero_bucket_bytes(n_params: int) -> frozenset:
    """Sizes in bytes (2- and 4-byte elements) of the buckets DeepSpeed allocates at every backward under the
    configs autosp writes (reduce, all-gather, ZeRO-3 prefetch; the reduce bucket capped at the model's size):
    :func:`attributed_peak` counts a block of exactly such a size as a ZeRO buffer, not as activations."""
    from autosp.contract import deepspeed_buffers as ds

    buckets = {ds.REDUCE_BUCKET_SIZE, ds.reduce_bucket_elements(n_params), ds.ALLGATHER_BUCKET_SIZE,
               ds.STAGE3_PREFETCH_BUCKET_SIZE}
    return frozenset(n * e for n in buckets for e in (2, 4))


def attributed_peak(forward, backward, step, module, optimizer, vocab: int, device,
                    bucket_bytes: frozenset = frozenset()) -> dict:
    """One training micro-step (``forward() -> loss``, ``backward(loss)``, ``step()``) measured three ways:

    - ``saved``: what the forward saved for backward (:class:`SavedTensors`);
    - ``peak`` / ``end``: bytes the step allocated on top of what existed at its start, at their peak
      and at the end (CPU: profiler allocation counter; CUDA: max_memory_allocated);
    - ``at_peak`` (CPU): the blocks alive at that peak, attributed by data pointer to ``activations``
      and ``logits_loss`` (saved for backward), ``gradients`` (a parameter's ``.grad`` when autograd
      accumulated it, or owned by the ZeRO optimizer after the backward), ``zero_buffers`` (blocks of
      exactly a configured ZeRO bucket size, ``bucket_bytes``: DeepSpeed allocates its reduce buckets
      with ``torch.empty(reduce_bucket_size)`` at every backward and releases them after it), and
      ``other`` (the backward working set, the loss's transient tensors, all-to-all staging, ZeRO-3's
      gathered parameters, ...).
    - ``before_step`` (CPU): ``peak`` and ``at_peak`` over the forward and backward only, and
      ``activation_peak``: the most bytes alive at any moment of them among the blocks they allocated, leaving
      out gradients and ZeRO buckets: the activations and the working set, the figure to compare with a
      prediction of activations. (The moment of the total peak is the wrong one for that in a small model:
      it can come in the backward's gradient reduction, when most activations are already freed.)
    """
    saved = SavedTensors(param_storage_keys(module), vocab, device)
    owned = {"gradients": set(), "zero_buffers": set()}

    def record_grad(p):
        key, _ = _storage_key(p.grad) if p.grad is not None else (None, 0)
        if key is not None:
            owned["gradients"].add(key[1])

    def run():
        handles = [p.register_post_accumulate_grad_hook(record_grad) for p in module.parameters() if p.requires_grad]
        try:
            with saved:
                loss = forward()
            backward(loss)
        finally:
            for h in handles:
                h.remove()
        for kind, ptrs in _owned_ptrs(module, optimizer).items():
            owned[kind] |= ptrs
        with torch.profiler.record_function(_STEP_MARK):
            step()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        max_allocated = torch.cuda.max_memory_allocated(device)
        free, total = torch.cuda.mem_get_info(device)
        return {"saved": saved.summary(), "peak": max_allocated - start,
                "end": torch.cuda.memory_allocated(device) - start, "method": "torch.cuda.max_memory_allocated",
                "cuda": {"max_allocated": max_allocated, "allocated_at_start": start,
                         "max_reserved": torch.cuda.max_memory_reserved(device),
                         # device memory the caching allocator does not manage: CUDA context, NCCL,
                         # cuBLAS/cuDNN handles (what the cost model's reserve charges besides fragmentation)
                         "outside_allocator": (total - free) - torch.cuda.memory_reserved(device),
                         "device_total": total}}
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = []
    step_start = None
    for ev in _profiled_events(prof):
        if ev.typed[0] == _EventType.Allocation and ev.typed[1].device.type == "cpu":
            f = ev.typed[1]
            events.append((ev.start_time_ns, f.allocation_id, f.ptr, f.alloc_size, f.total_allocated))
        elif ev.name == _STEP_MARK:
            step_start = ev.start_time_ns
    out = {"saved": saved.summary(), "method": "torch.profiler profile_memory total_allocated", "events": len(events)}
    if not events:
        return {**out, "peak": 0, "end": 0, "at_peak": {},
                "before_step": {"peak": 0, "at_peak": {}, "activation_peak": 0, "other_largest_blocks": []}}
    events.sort()
    kinds = {key[1]: kind for key, (_, kind, _, _) in saved.saved.items()}
    best, at_peak, other_blocks, best_t, current = _peak(events, kinds, owned, bucket_bytes)
    before = [e for e in events if step_start is None or e[0] < step_start]
    before_best, before_at_peak, before_other = (_peak(before, kinds, owned, bucket_bytes)[:3] if before
                                                 else (0, {}, []))
    activation_peak = _activation_peak(before, owned, bucket_bytes)
    span = max(1, events[-1][0] - events[0][0])
    return {**out, "peak": best, "end": current, "at_peak": at_peak,
            "other_largest_blocks": sorted(other_blocks, reverse=True)[:6],
            "peak_at_fraction_of_step": round((best_t - events[0][0]) / span, 3),
            "before_step": {"peak": before_best, "at_peak": before_at_peak, "activation_peak": activation_peak,
                            "other_largest_blocks": sorted(before_other, reverse=True)[:6]}}


def _profiled_events(prof):
    """Every event of a finished ``torch.profiler.profile``, its tree walked depth first (allocations are leaves)."""
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def allocated_peak(fn) -> int:
    """CPU: the most bytes ``fn`` holds allocated at once, on top of what existed when it started (the
    profiler's allocation events in time order; frees of older blocks count, so a peak reached after freeing
    older tensors is measured from below the start, never above)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes = [(event.start_time_ns, event.typed[1].alloc_size) for event in _profiled_events(prof)
             if event.typed[0] == _EventType.Allocation]
    current = peak = 0
    for _, size in sorted(sizes):
        current += size
        peak = max(peak, current)
    return peak


_STEP_MARK = "autosp.studies.optimizer_step"
"""The profiler range around the optimizer step: what allocates after its start is the step's."""


def _activation_peak(events, owned, bucket_bytes) -> int:
    """The most bytes alive at once among the blocks ``events`` allocate, gradients and ZeRO buckets left out.

    ``owned`` holds the data pointers of the gradients alive after the backward; the allocator reuses
    addresses, so only the *last* allocation at such a pointer is that gradient (an activation freed earlier
    may have lived there). Frees of blocks allocated before the events are ignored."""
    last = {}
    for i, (_, _, ptr, size, _) in enumerate(events):
        if size > 0:
            last[ptr] = i
    states = {last[p] for kind in ("gradients", "zero_buffers") for p in owned.get(kind, ()) if p in last}
    live: dict = {}
    current = best = 0
    for i, (_, _, ptr, size, _) in enumerate(events):
        if size > 0:
            if i in states or size in bucket_bytes:
                continue
            live[ptr] = size
            current += size
            best = max(best, current)
        else:
            current -= live.pop(ptr, 0)
    return best


def _peak(events, kinds, owned, bucket_bytes) -> tuple:
    """(peak bytes above the first event's baseline, those bytes attributed, the sizes of the unattributed
    blocks, the peak's time, the bytes at the last event) over time-sorted allocation ``events``."""
    base = events[0][4] - events[0][3]
    live: dict = {}
    best, best_live, best_t, current = -1, {}, events[0][0], 0
    for t, _, ptr, size, total in events:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
        current = total - base
        if current > best:
            best, best_live, best_t = current, dict(live), t
    at_peak = {"activations": 0, "logits_loss": 0, "gradients": 0, "zero_buffers": 0, "other": 0}
    other_blocks = []
    for ptr, size in best_live.items():
        kind = kinds.get(ptr)
        if kind in ("activations", "logits_loss"):
            at_peak[kind] += size
        elif ptr in owned.get("gradients", ()):
            at_peak["gradients"] += size
        elif ptr in owned.get("zero_buffers", ()) or size in bucket_bytes:
            at_peak["zero_buffers"] += size
        else:
            at_peak["other"] += size
            other_blocks.append(size)
    return best, at_peak, other_blocks, best_t, current


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_peak(run_step) -> dict:
    """CPU: ``{"hwm", "rss_start", "heap_in_use"}`` bytes: the resident-set high-water mark during one step
    (after resetting it), the resident set at its start, and glibc's in-use heap bytes at its start."""
    reset = False
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        pass
    rss = _status_kib("VmRSS")
    heap = None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        m = libc.mallinfo2()
        heap = m.uordblks + m.hblkhd
    except (OSError, AttributeError):
        pass
    run_step()
    hwm = _status_kib("VmHWM")
    return {"hwm": hwm * 1024 if hwm is not None and reset else None,
            "rss_start": rss * 1024 if rss is not None else None, "heap_in_use_start": heap}


def cpu_seconds() -> float:
    """CPU time of this process (all its threads)."""
    t = os.times()
    return t.user + t.system
