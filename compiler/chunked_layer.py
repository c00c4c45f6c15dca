"""Sequence-chunked decoder layers (plan knob ``sequence_chunks`` = n, with ``offload_chunks``): the op that runs
one decoder layer over the rank's tokens in n chunks, forward and backward.

The chunking pass (:mod:`autosp.compiler.passes.chunking`) cuts each decoder layer out of the Dynamo graph
(after the SP passes: its Ulysses all-to-alls, ring attention, tiled MLP are inside) into a
:class:`LayerProgram`, a graph over ONE chunk whose attention node calls :func:`attend`, and replaces the
layer by ``autosp_ops::chunked_layer`` (a ``torch.library.custom_op``: opaque to AOTAutograd and Inductor, so
the chunks are never fused back into one s-token tensor).

The runtime's layout (:func:`~autosp.compiler.attention.layout.chunked_rank_spans`) makes a rank's local chunk
i its share of global chunk i, so after chunk i's all-to-all the rank holds global chunk i for its heads,
and chunk i attends exactly the key/value chunks <= i (the causal rule on global spans,
:mod:`autosp.compiler.attention.pieces`: chunks < i in full, chunk i's causal diagonal). Packed documents and
sliding windows restrict it further, exactly as for whole layers: the pieces of each batch row's documents and
the layer's window (:mod:`autosp.compiler.attention.local`, the engine's published documents of this call); a
chunk pair with nothing to attend (another document, or beyond the window) runs no kernel.

Forward, chunk i = 0 .. n-1 (no autograd)::

    run the layer program on the chunk's token-wise inputs (hidden states, rotary tables):
        norm, q/k/v projections, RoPE, the chunk's all-to-alls      -> q_i, k_i, v_i  (U*c rows, H/U heads)
        attend: keep k_i, v_i; for j <= i: merge q_i's attention over k_j, v_j by log-sum-exp
                (local.rows_forward over blockwise.block_forward; with a ring, ring.ring_block_forward passes k_j, v_j
                around)
                keep the merged out_i and lse_i
        the output all-to-all, o_proj, residual, norm, MLP, residual -> y_i (written into the layer output)

Saved per chunk (the op's extra outputs, what autograd keeps): k_i, v_i, out_i (q's dtype), lse_i (fp32), and
the chunk's token-wise inputs x_i (the layer input and rotary tables; without offload these are the op's
inputs themselves, saved whole). Nothing else of the layer is kept: q, the projections, norms, MLP
intermediates and their all-to-alls are recomputed in the backward, one chunk at a time.

Backward, chunk i = n-1 .. 0 (reverse: every query chunk >= i has added its dK/dV to chunk i by then)::

    recompute the layer program on x_i with autograd, attention replaced by _SavedAttention
        (returns the saved out_i; its backward runs local.rows_backward of q_i against k_j, v_j for
        every j <= i with the saved out_i, lse_i: dq_i, and dK_j/dV_j added to float32 accumulators, chunk i's
        own complete now)
    autograd.grad of y_i with the layer output's gradient rows: dx_i, and the weights' gradients summed over
        chunks (float32 for 16-bit weights)

So per layer the backward runs one more forward of everything but attention (projections, MLP, norms, and
the forward all-to-alls / ring passes of k, v, q and out again) and the attention backward once: the cost of
``full`` checkpointing without recomputing attention. The device holds one chunk's working set plus the
saved chunks; with ``offload_chunks`` every saved chunk (x_i, k_i, v_i, out_i, lse_i) and the backward's
dK/dV accumulators live in host memory (:mod:`autosp.compiler.passes.offload`'s copy ops: pinned buffers and
a side stream on CUDA), the key/value chunk j + 1 is prefetched while chunk j is attended, so the device holds
O(chunk) per layer. On a CPU device the copies are real copies into separate buffers allocated by numpy
(outside torch's CPU allocator, so the allocation profiler that measures the device peak does not see them),
registered as host copies (:func:`~autosp.compiler.passes.offload.is_host_copy`: the saved-tensor hooks count
them as host bytes); reloading makes a torch-allocated copy, which is device memory.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import torch
from torch import fx

from autosp.compiler import ops
from autosp.compiler.attention.layout import chunk_ring_spans, chunk_sizes
from autosp.compiler.attention.local import rows_backward, rows_forward, rule_documents
from autosp.compiler.attention.merge import empty_accumulators
from autosp.compiler.attention.sinks import fold_sinks, sinks_grad
from autosp.compiler.passes import offload as host

_KEYS = itertools.count()
PROGRAMS: dict[int, "LayerProgram"] = {}
"""Every layer program the chunking pass built, by the key the op receives."""


@dataclass
class LayerProgram:
    """One decoder layer over one chunk: ``graph[c](*chunked, *consts, *params)`` returns the layer's outputs for
    a chunk of c tokens; its attention node calls :func:`attend`."""

    graph: fx.GraphModule
    chunk_dims: list            # sequence dim of each chunked input
    outputs: list               # (full shape, dtype, sequence dim) of each layer output
    q_shape: tuple              # full (all chunks) shape of the attention's q, k, v after the all-to-all
    k_shape: tuple
    v_shape: tuple
    dtype: torch.dtype          # of q (the saved attention output)
    kv_dtype: torch.dtype
    scale: float | None
    chunks: int
    offload: bool
    global_len: int
    ulysses: int
    ring: int
    ring_group: str | None
    returns_lse: bool           # the replaced attention node was ring or span attention: (out, lse)
    local_len: int = 0
    rule: str = ""              # the engine whose packed documents restrict attention ("" for none)
    window: int = 0             # the layer's sliding window in tokens (0 for none)
    softcap: float = 0.0        # the layer's attention logit soft-cap (Gemma 2; 0 for none)
    stats: dict = field(default_factory=dict)

    def documents(self, batch: int):
        """Per batch row: the packed documents this call's attention keeps to (None: one sequence per row)."""
        return rule_documents(self.rule, batch)

    @property
    def sizes(self) -> list[int]:
        return chunk_sizes(self.local_len, self.chunks)

    def rows(self, i: int) -> int:
        """Rows of chunk i after the all-to-all (the U ranks' chunk i)."""
        return self.ulysses * self.sizes[i]

    def spans(self, i: int) -> list:
        """Global spans of chunk i held by each ring position after the all-to-all."""
        return chunk_ring_spans(self.global_len, self.ulysses, self.ring, self.chunks, i)

    def saved_per_chunk(self, n_chunked: int) -> int:
        return (n_chunked if self.offload else 0) + 4


def register(program: LayerProgram) -> int:
    key = next(_KEYS)
    PROGRAMS[key] = program
    if program.offload:
        host.HOST_KEPT_OUTPUTS[key] = len(program.outputs)
    return key


# --- where the chunk's saved tensors live ----------------------------------------------------------------
def _host_copy_on_cpu(t: torch.Tensor) -> torch.Tensor:
    """A real copy of ``t`` in memory outside torch's CPU allocator (numpy's), registered as a host copy: on a
    CPU device this is what "host memory" means, and the allocation profiler that measures a step's device
    peak (studies/measure/memory.py) does not see it, so a measurement counts host copies apart."""
    import numpy as np

    dtype = t.dtype
    if dtype == torch.bfloat16:  # numpy has no bfloat16: store the bits
        out = torch.from_numpy(np.empty(tuple(t.shape), dtype=np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(np.empty(tuple(t.shape), dtype=torch.empty(0, dtype=dtype).numpy().dtype))
    out.copy_(t)
    host._HOST_COPIES[out.untyped_storage().data_ptr()] = out
    host.OFFLOADED["bytes"] += out.numel() * out.element_size()
    host.OFFLOADED["calls"] += 1
    return out


def _keep(t: torch.Tensor, offload: bool) -> torch.Tensor:
    """What is saved of ``t``: a host copy (``offload``), else ``t`` itself (a fresh tensor, never a view, so
    the op's outputs do not alias)."""
    if offload and t.device.type == "cpu":
        return _host_copy_on_cpu(t)
    if offload:  # CUDA: pinned buffer, copied on the side stream (passes/offload.py)
        return torch.ops.autosp_ops.offload_wait(torch.ops.autosp_ops.offload(t), t)
    t = t.contiguous()
    return t.clone() if t._base is not None else t


class _Loader:
    """Device copies of saved tensors, the next one's copy started before the current one is used (CUDA: on
    the offload side stream; CPU: a real copy)."""

    def __init__(self, device: torch.device, offload: bool):
        self.device, self.offload, self.pending = device, offload, {}

    def start(self, key, t: torch.Tensor) -> None:
        if self.offload and key not in self.pending:
            self.pending[key] = torch.ops.autosp_ops.reload(t, self.device, list(t.shape), list(t.stride()))

    def get(self, key, t: torch.Tensor) -> torch.Tensor:
        if not self.offload:
            return t
        self.start(key, t)
        return torch.ops.autosp_ops.reload_wait(self.pending.pop(key))


def _ring_pg(program: LayerProgram):
    return ops._group(program.ring_group) if program.ring > 1 else None


# --- the attention inside the layer program ----------------------------------------------------------------
_ACTIVE: list = []


@contextlib.contextmanager
def _active(state):
    _ACTIVE.append(state)
    try:
        yield state
    finally:
        _ACTIVE.pop()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None):
    """The attention node of a layer program: chunk i's queries over key/value chunks <= i (``sinks``: the local
    heads' sink logits, gpt-oss, merged once after every chunk's: :mod:`autosp.compiler.attention.sinks`)."""
    if not _ACTIVE:
        raise RuntimeError("autosp: a chunked layer program ran outside autosp_ops::chunked_layer")
    return _ACTIVE[-1].attend(q, k, v, sinks)


class _ForwardState:
    def __init__(self, program: LayerProgram, device: torch.device):
        self.program, self.index = program, 0
        self.k, self.v, self.out, self.lse = [], [], [], []
        self.loader = _Loader(device, program.offload)
        self.pg = _ring_pg(program)

    def attend(self, q, k, v, sinks=None):
        p, i = self.program, self.index
        if p.ring > 1:
            ops.CALLS["ring_attention"] += 1
        k, v = k.contiguous(), v.contiguous()
        acc = empty_accumulators(q, v.shape[-1])
        q_spans = p.spans(i)
        for j in range(i + 1):
            if j + 1 < i:
                self.loader.start(("k", j + 1), self.k[j + 1])
                self.loader.start(("v", j + 1), self.v[j + 1])
            kj = k if j == i else self.loader.get(("k", j), self.k[j])
            vj = v if j == i else self.loader.get(("v", j), self.v[j])
            _attend_block(p, self.pg, q, kj, vj, q_spans, p.spans(j), acc)
        if sinks is not None:
            fold_sinks(*acc, sinks)
        self.k.append(_keep(k, p.offload))
        self.v.append(_keep(v, p.offload))
        out, lse = acc[0].to(q.dtype), acc[1]
        self.out.append(_keep(out, p.offload))
        self.lse.append(_keep(lse, p.offload))
        return (out, lse) if p.returns_lse else out


def _attend_block(p, pg, q, k, v, q_spans, k_spans, acc) -> None:
    if pg is None:  # the pieces of each row's documents and window (one causal sequence when there are none)
        rows_forward(q, k, v, q_spans[0], k_spans[0], p.scale, p.documents(q.shape[0]), p.window, acc, p.softcap)
    else:
        from autosp.compiler.attention.ring import ring_block_forward

        ring_block_forward(q, k, v, p.scale, pg, q_spans, k_spans, acc, p.documents(q.shape[0]), p.window,
                           p.softcap)


class _BackwardState:
    """Chunk i's recompute: attention returns the saved output; its backward adds dK/dV into the accumulators."""

    def __init__(self, program: LayerProgram, device, saved_k, saved_v, out, lse):
        self.program, self.device = program, device
        self.saved_k, self.saved_v = saved_k, saved_v
        self.out, self.lse = out, lse                           # chunk i's, on the device
        self.dk: dict = {}                                      # chunk j -> float32 accumulator (host with offload)
        self.dv: dict = {}
        self.loader = _Loader(device, program.offload)
        self.pg = _ring_pg(program)
        self.index = 0

    def attend(self, q, k, v, sinks=None):
        out = _SavedAttention.apply(q, k, v, sinks, self)
        return (out, self.lse) if self.program.returns_lse else out

    def _accumulate(self, store: dict, j: int, part: torch.Tensor) -> None:
        if self.program.offload:
            prev = store.get(j)
            total = part if prev is None else self.loader.get(("acc", id(store), j), prev) + part
            store[j] = _keep(total, True)
        else:
            store[j] = part if j not in store else store[j] + part

    def _take(self, store: dict, j: int, like: torch.Tensor) -> torch.Tensor:
        prev = store.pop(j, None)
        if prev is None:
            return torch.zeros(like.shape, dtype=torch.float32, device=like.device)
        return self.loader.get(("acc", id(store), j), prev) if self.program.offload else prev

    def backward(self, dout, q, k, v):
        p, i = self.program, self.index
        if p.ring > 1:
            ops.CALLS["ring_attention_backward"] += 1
        dout, q, k, v = dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        q_spans = p.spans(i)
        for j in range(i, -1, -1):
            if j - 1 >= 0:
                self.loader.start(("k", j - 1), self.saved_k[j - 1])
                self.loader.start(("v", j - 1), self.saved_v[j - 1])
            kj = k if j == i else self.loader.get(("k", j), self.saved_k[j])
            vj = v if j == i else self.loader.get(("v", j), self.saved_v[j])
            if self.pg is None:
                dk = torch.zeros(kj.shape, dtype=torch.float32, device=kj.device)
                dv = torch.zeros(vj.shape, dtype=torch.float32, device=vj.device)
                rows_backward(dout, q, kj, vj, self.out, self.lse, q_spans[0], p.spans(j)[0], p.scale,
                              p.documents(q.shape[0]), p.window, (dq, dk, dv), p.softcap)
            else:
                from autosp.compiler.attention.ring import ring_block_backward

                dk, dv = ring_block_backward(dout, q, kj, vj, self.out, self.lse, p.scale, self.pg, q_spans,
                                             p.spans(j), dq, p.documents(q.shape[0]), p.window, p.softcap)
            if j == i:
                dk_i, dv_i = dk, dv
            else:
                self._accumulate(self.dk, j, dk)
                self._accumulate(self.dv, j, dv)
        dk_i = dk_i + self._take(self.dk, i, k)   # what the later query chunks added
        dv_i = dv_i + self._take(self.dv, i, v)
        return dq.to(q.dtype), dk_i.to(k.dtype), dv_i.to(v.dtype)


class _SavedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, state):
        ctx.state = state
        ctx.save_for_backward(q, k, v, sinks)
        return state.out.clone()

    @staticmethod
    def backward(ctx, dout):
        q, k, v, sinks = ctx.saved_tensors
        dq, dk, dv = ctx.state.backward(dout, q, k, v)
        # the saved (out, lse) include the sinks: the pieces' backward above is already the gradient with them
        dsinks = None if sinks is None else sinks_grad(dout, ctx.state.out, ctx.state.lse, sinks)
        return dq, dk, dv, dsinks, None


# --- the ops --------------------------------------------------------------------------------------------
def _split(t: torch.Tensor, dim: int, sizes) -> list:
    return list(torch.split(t, sizes, dim=dim))


def _check_inputs(p: LayerProgram, chunked) -> None:
    for x, dim in zip(chunked, p.chunk_dims):
        if x.shape[dim] != p.local_len:
            raise RuntimeError(f"autosp_ops::chunked_layer: an input has {x.shape[dim]} tokens, the program "
                               f"was built for {p.local_len}")


@torch.library.custom_op("autosp_ops::chunked_layer", mutates_args=())
def chunked_layer(chunked: list[torch.Tensor], consts: list[torch.Tensor], params: list[torch.Tensor],
                  key: int) -> list[torch.Tensor]:
    """[layer outputs..., saved per chunk...]: see the module docstring."""
    p = PROGRAMS[key]
    _check_inputs(p, chunked)
    ops.CALLS["chunked_layer"] += 1
    sizes = p.sizes
    device = chunked[0].device
    pieces = [_split(x, d, sizes) for x, d in zip(chunked, p.chunk_dims)]
    outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in p.outputs]
    state = _ForwardState(p, device)
    saved_x = []
    start = 0
    with torch.no_grad(), _active(state):
        for i, c in enumerate(sizes):
            state.index = i
            xs = [piece[i] for piece in pieces]
            ys = p.graph[c](*xs, *consts, *params)
            for out, y, (_, _, dim) in zip(outs, ys, p.outputs):
                out.narrow(dim, start, c).copy_(y)
            if p.offload:
                saved_x.append([_keep(x, True) for x in xs])
            start += c
    saved = []
    for i in range(p.chunks):
        saved += (saved_x[i] if p.offload else []) + [state.k[i], state.v[i], state.out[i], state.lse[i]]
    return outs + saved


def _fake_saved(p: LayerProgram, chunked) -> list:
    device = torch.device("cpu") if p.offload else chunked[0].device
    out = []
    for i, c in enumerate(p.sizes):
        rows = p.rows(i)
        if p.offload:
            for x, dim in zip(chunked, p.chunk_dims):
                shape = list(x.shape)
                shape[dim] = c
                out.append(x.new_empty(shape, device=device))
        for shape, dtype in ((p.k_shape, p.kv_dtype), (p.v_shape, p.kv_dtype)):
            out.append(torch.empty((*shape[:2], rows, shape[3]), dtype=dtype, device=device))
        out.append(torch.empty((*p.q_shape[:2], rows, p.v_shape[3]), dtype=p.dtype, device=device))
        out.append(torch.empty((*p.q_shape[:2], rows), dtype=torch.float32, device=device))
    return out


@chunked_layer.register_fake
def _chunked_layer_fake(chunked, consts, params, key):
    p = PROGRAMS[key]
    device = chunked[0].device
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in p.outputs] + _fake_saved(p, chunked)


@contextlib.contextmanager
def _autograd_inside_op():
    """Autograd inside an op implementation: the dispatcher runs it below autograd; re-enable it."""
    with torch.enable_grad(), \
            torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False), \
            torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        yield


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(t.is_floating_point())


@torch.library.custom_op("autosp_ops::chunked_layer_backward", mutates_args=())
def chunked_layer_backward(grads: list[torch.Tensor], chunked: list[torch.Tensor], consts: list[torch.Tensor],
                           params: list[torch.Tensor], saved: list[torch.Tensor], shapes: list[int],
                           key: int) -> list[torch.Tensor]:
    """[d chunked..., d consts..., d params...] (zeros for inputs the layer does not differentiate).
    ``chunked`` is empty with offload (the chunks come from ``saved``); ``shapes`` then gives their shapes."""
    p = PROGRAMS[key]
    ops.CALLS["chunked_layer_backward"] += 1
    device = grads[0].device
    sizes = p.sizes
    n_chunked = len(p.chunk_dims)
    per = p.saved_per_chunk(n_chunked)
    rows = [saved[i * per:(i + 1) * per] for i in range(p.chunks)]
    saved_k = [r[-4] for r in rows]
    saved_v = [r[-3] for r in rows]
    full_shapes = _unflatten_shapes(shapes)
    if p.offload:
        pieces = None
        dtypes = [rows[0][m].dtype for m in range(n_chunked)]
    else:
        pieces = [_split(x, d, sizes) for x, d in zip(chunked, p.chunk_dims)]
        dtypes = [x.dtype for x in chunked]
    d_chunked = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in zip(full_shapes, dtypes)]
    acc_dtype = lambda t: torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype  # noqa: E731
    d_consts = [torch.zeros(t.shape, dtype=acc_dtype(t), device=t.device) for t in consts]
    d_params = [torch.zeros(t.shape, dtype=acc_dtype(t), device=t.device) for t in params]
    const_leaves = [_leaf(t) for t in consts]
    param_leaves = [_leaf(t) for t in params]
    state = _BackwardState(p, device, saved_k, saved_v, None, None)
    loader = _Loader(device, p.offload)
    grad_pieces = [_split(g, dim, sizes) for g, (_, _, dim) in zip(grads, p.outputs)]
    starts = [sum(sizes[:i]) for i in range(p.chunks)]
    with _active(state):
        for i in range(p.chunks - 1, -1, -1):
            state.index = i
            state.out = loader.get(("out", i), rows[i][-2])
            state.lse = loader.get(("lse", i), rows[i][-1])
            if p.offload:
                xs = [loader.get(("x", i, m), rows[i][m]) for m in range(n_chunked)]
            else:
                xs = [piece[i] for piece in pieces]
            x_leaves = [_leaf(x) for x in xs]
            with _autograd_inside_op():
                ys = p.graph[sizes[i]](*x_leaves, *const_leaves, *param_leaves)
                pairs = [(y, g[i]) for y, g in zip(ys, grad_pieces) if y.requires_grad]
                inputs = [t for t in (*x_leaves, *const_leaves, *param_leaves) if t.requires_grad]
                got = torch.autograd.grad([y for y, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
            got = iter(got)
            for m, x in enumerate(x_leaves):
                if x.requires_grad:
                    g = next(got)
                    if g is not None:
                        d_chunked[m].narrow(p.chunk_dims[m], starts[i], sizes[i]).copy_(g)
            for acc, t in itertools.chain(zip(d_consts, const_leaves), zip(d_params, param_leaves)):
                if t.requires_grad:
                    g = next(got)
                    if g is not None:
                        acc.add_(g)
            del ys, pairs, x_leaves, xs
    return d_chunked + [d.to(t.dtype) for d, t in zip(d_consts, consts)] + [d.to(t.dtype) for d, t in
                                                                           zip(d_params, params)]


def _flatten_shapes(tensors) -> list[int]:
    out = []
    for t in tensors:
        out += [t.dim(), *t.shape]
    return out


def _unflatten_shapes(flat) -> list[tuple]:
    out, i = [], 0
    while i < len(flat):
        n = flat[i]
        out.append(tuple(flat[i + 1:i + 1 + n]))
        i += 1 + n
    return out


@chunked_layer_backward.register_fake
def _chunked_layer_backward_fake(grads, chunked, consts, params, saved, shapes, key):
    p = PROGRAMS[key]
    n_chunked = len(p.chunk_dims)
    if p.offload:
        dtypes = [saved[m].dtype for m in range(n_chunked)]
    else:
        dtypes = [x.dtype for x in chunked]
    device = grads[0].device
    return ([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in zip(_unflatten_shapes(shapes), dtypes)]
            + [torch.empty_like(t) for t in consts] + [torch.empty_like(t) for t in params])


def _setup(ctx, inputs, output):
    chunked, consts, params, key = inputs
    p = PROGRAMS[key]
    ctx.key = key
    ctx.n_out = len(p.outputs)
    ctx.counts = (len(chunked), len(consts), len(params))
    ctx.shapes = _flatten_shapes(chunked)
    saved = list(output[ctx.n_out:])
    keep_chunked = [] if p.offload else list(chunked)  # without offload the inputs themselves are the saved x
    ctx.save_for_backward(*keep_chunked, *consts, *params, *saved)
    ctx.n_keep = len(keep_chunked)
    ctx.mark_non_differentiable(*saved)


def _backward(ctx, grads):
    n_chunked, n_consts, n_params = ctx.counts
    tensors = list(ctx.saved_tensors)
    chunked = tensors[:ctx.n_keep]
    consts = tensors[ctx.n_keep:ctx.n_keep + n_consts]
    params = tensors[ctx.n_keep + n_consts:ctx.n_keep + n_consts + n_params]
    saved = tensors[ctx.n_keep + n_consts + n_params:]
    p = PROGRAMS[ctx.key]
    device = next(g.device for g in grads[:ctx.n_out] if g is not None)
    out_grads = []
    for g, (shape, dtype, _) in zip(grads[:ctx.n_out], p.outputs):
        out_grads.append(g.contiguous() if g is not None else torch.zeros(shape, dtype=dtype, device=device))
    result = chunked_layer_backward(out_grads, chunked, consts, params, saved, ctx.shapes, ctx.key)
    d_chunked = result[:n_chunked]
    d_consts = result[n_chunked:n_chunked + n_consts]
    d_params = result[n_chunked + n_consts:]
    return d_chunked, d_consts, d_params, None


chunked_layer.register_autograd(_backward, setup_context=_setup)

CHUNKED_LAYER = torch.ops.autosp_ops.chunked_layer.default

__all__ = ["CHUNKED_LAYER", "LayerProgram", "PROGRAMS", "attend", "chunked_layer", "chunked_layer_backward",
           "register"]
