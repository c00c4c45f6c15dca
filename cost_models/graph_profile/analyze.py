"""From recorded training steps to a :class:`~autosp.cost_models.profile.ModelProfile`.

:func:`measure` reads one :class:`~autosp.cost_models.graph_profile.trace.StepTrace` and returns the
quantities of the last decoder layer (and of what lies outside the layers) at that sequence length,
as a flat ``{name: value}`` of per-sequence totals. :func:`build_profile` fits each quantity over
the traced sequence lengths and assembles the profile. Plain Python: it needs the records, not
torch.

How a layer's tensors are classified (by the op that produced each saved storage):

- ``input``: the layer's input (the residual stream; the checkpoint boundary of every policy).
- ``collective``: what Ulysses' all-to-alls would produce: the q, k, v that enter SDPA (after RoPE:
  the all-to-all comes last) and the attention output once laid out for the output projection
  (the inverse all-to-all's output). In this single-device trace they are RoPE adds and a
  transpose+contiguous copy; under Ulysses they are collective outputs, and that is how the
  policies of specs.CHECKPOINTING_POLICIES treat them.
- ``attention``: outputs of the SDPA kernel (output, logsumexp) and any S x S tensor (an eager
  attention's scores).
- ``matmul``: outputs of mm/addmm/bmm (projections, MLP).
- ``norm``: anything produced inside a module whose class name contains "Norm" (HF's RMSNorm is a
  chain of pointwise ops).
- ``pointwise``: everything else (activations, RoPE halves, residual adds, casts, dropout masks).

A policy keeps, per layer, the layer input plus the saved tensors of its keep classes
(selective: matmul, attention, collective; sequence: attention, collective; full: none), and the
keep-class tensors (or the input) that recomputing the other saved tensors starts from: starting
from every saved tensor that is not kept, walk back through its producers until a kept-class tensor
or the layer input. Everything visited on the way is recomputed in the backward.
"""

from __future__ import annotations

from autosp.cost_models.graph_profile.fit import clean, clean_ratio, fit_flops, fit_linear
from autosp.cost_models.op_classes import KEEP_CLASSES
from autosp.cost_models.profile import Elems, ModelProfile
from autosp.cost_models.specs import CHECKPOINTING_POLICIES


LAYOUT_OPS = {"clone", "_unsafe_view", "contiguous", "transpose", "permute", "reshape", "expand", "view",
              "_reshape_alias", "as_strided", "slice", "select", "unsqueeze", "squeeze", "t", "alias", "detach",
              "split", "split_with_sizes", "unbind"}

FLASH_DQ_ACCUMULATOR = 2
"""Flash-attention backward accumulates dq in fp32 inside the kernel (FlashAttention-2, arXiv
2307.08691): 4 bytes per query element (2 x the 2-byte element). A kernel workspace, invisible to a
fake trace; added to the live bytes during the SDPA backward op so the graph profile describes the
GPU kernel."""

CLASSES = ("input", "collective", "attention", "matmul", "norm", "pointwise")


class LayerAnalysis:
    """Structure of one decoder layer in one trace: classes, policies, windows."""

    def __init__(self, tr, layer: int = -1):
        self.tr = tr
        self.S = tr.seq_len * tr.batch
        self.name = tr.layer_names[layer]
        self.all_layers = tuple(tr.layer_names)
        ops = tr.ops
        bs = tr.backward_start
        self.fwd = [o for o in ops[:bs] if self.inl(o.module)]
        self.bwd = [o for o in ops[bs:] if self.inl(o.module)]
        children = [n for n in tr.module_classes if n.startswith(self.name + ".") and "." not in n[len(self.name) + 1:]]
        self.sdpa = [c for c in tr.sdpa if self.inl(ops[c.op].module)]
        if not self.sdpa:
            raise ValueError("no scaled_dot_product_attention call in the decoder layer: Ulysses needs the model's "
                             "attention to go through torch.nn.functional.scaled_dot_product_attention")
        sdpa_mods = {ops[c.op].module for c in self.sdpa}
        self.attn_children = [c for c in children if any(m == c or m.startswith(c + ".") for m in sdpa_mods)]
        # The MLP: the child modules with matmuls that run entirely after the attention's output projection
        # (the first matmul after the last SDPA call); the norm in front of it is not part of it (a tiled MLP
        # keeps its input).
        after = [o.idx for o in self.fwd if o.kind == "matmul" and o.idx > max(c.op for c in self.sdpa)]
        o_proj = min(after) if after else len(ops)

        def ops_of(child):
            return [o for o in self.fwd if o.module == child or o.module.startswith(child + ".")]

        self.mlp_children = [c for c in children if c not in self.attn_children
                             and any(o.kind == "matmul" for o in ops_of(c))
                             and min(o.idx for o in ops_of(c)) > o_proj]
        self.excluded = tr.param_sids | tr.buffer_sids | tr.input_sids
        self.st = dict(tr.storages)   # plus virtual storages (see _classify)
        self.alloc = {sid for o in self.fwd for sid in o.new}
        self.X = set(tr.layer_inputs.get(self.name, ()))
        self.sdpa_last = max(c.op for c in self.sdpa)
        self.virtual_out = None
        # the layer's saved set (deduplicated by storage): what its backward nodes read back; tensors
        # produced outside the layer and read here (rotary tables) are shared by all layers
        self.saved = {}
        self.shared = set()
        for sid, readers in tr.saved_by.items():
            if sid in self.excluded or not any(self.inl(m) for m in readers):
                continue
            if sid in self.alloc or sid in self.X:
                self.saved[sid] = sorted(m for m in readers if self.inl(m))
            else:
                self.shared.add(sid)
        self._classify()

    # module predicates -------------------------------------------------------------------------------
    def inl(self, module: str) -> bool:
        return module == self.name or module.startswith(self.name + ".")

    def in_mlp(self, module: str) -> bool:
        return any(module == c or module.startswith(c + ".") for c in self.mlp_children)

    def in_attn(self, module: str) -> bool:
        return any(module == c or module.startswith(c + ".") for c in self.attn_children)

    # classes ---------------------------------------------------------------------------------------
    def _classify(self):
        tr, ops = self.tr, self.tr.ops
        self.kv_share = {}     # sid -> fraction of its bytes that are K/V (Ulysses replicates them)
        collective = set()
        for c in self.sdpa:
            qb, kb, vb = c.view_bytes
            parts = {}
            for sid, nbytes, is_kv in ((c.q, qb, False), (c.k, kb, True), (c.v, vb, True)):
                tot, kv = parts.get(sid, (0, 0))
                parts[sid] = (tot + nbytes, kv + (nbytes if is_kv else 0))
            for sid, (tot, kv) in parts.items():
                collective.add(sid)
                self.kv_share[sid] = kv / tot if tot else 0.0
            # the attention output laid out for the output projection (the inverse all-to-all's output)
            frontier = {c.out}
            for o in ops[c.op + 1:]:
                if o.bwd or not self.inl(o.module):
                    continue
                if (o.kind == "view" or o.name in LAYOUT_OPS) and any(i in frontier for i in o.ins):
                    frontier.update(o.outs)
            for o in self.fwd:
                if o.idx > c.op and o.kind == "matmul":
                    for i in o.ins:
                        if i not in frontier:
                            continue
                        if i != c.out:
                            collective.add(i)
                            continue
                        # The projection reads the kernel's output in place (flash attention returns it in
                        # [B, S, heads, d] memory order, so transpose + contiguous copies nothing). Under
                        # Ulysses the inverse all-to-all makes a new, sequence-sharded tensor that the
                        # projection saves: a virtual storage of the same size stands for it.
                        out = self.st[c.out]
                        vsid = -1 - len([k for k in self.st if k < 0])
                        self.st[vsid] = type(out)(sid=vsid, nbytes=out.nbytes, dtype=out.dtype, shape=out.shape,
                                                  producer=c.op, alloc=o.idx, free=out.free)
                        self.alloc.add(vsid)
                        self.saved[vsid] = [o.module]
                        self.virtual_out = vsid
                        collective.add(vsid)
        self.collective = collective
        self.cls = {}
        for sid in set(self.saved) | self.alloc | self.X:
            self.cls[sid] = self._class_of(sid)

    def _class_of(self, sid) -> str:
        if sid in self.X:
            return "input"
        if sid in self.collective:
            return "collective"
        st = self.st[sid]
        prod = self.tr.ops[st.producer] if st.producer >= 0 else None
        if prod is None:
            return "pointwise"
        if prod.kind == "attention":
            return "attention"
        if prod.kind == "matmul":
            return "matmul"
        if sum(1 for n in st.shape if n == self.tr.seq_len) >= 2:
            return "attention"
        if "norm" in self.tr.module_classes.get(prod.module, "").lower():
            return "norm"
        return "pointwise"

    def side(self, sid) -> str:
        st = self.st[sid]
        if st.producer >= 0 and self.in_mlp(self.tr.ops[st.producer].module):
            return "mlp"
        return "attn"

    def size(self, sids) -> Elems:
        """Elements (trace dtype; K/V split out) and fixed bytes (other dtypes) of a set of storages."""
        other = kv = fixed = 0.0
        for sid in sids:
            st = self.st[sid]
            if st.dtype == self.tr.dtype:
                elems = st.nbytes / 2
                share = self.kv_share.get(sid, 0.0)
                kv += elems * share
                other += elems * (1 - share)
            else:
                fixed += st.nbytes
        return Elems(other, kv, fixed)

    # policies --------------------------------------------------------------------------------------
    def policy_sets(self, policy: str) -> tuple[set, set]:
        """(kept, recomputed) storages of the layer under ``policy``."""
        if policy == "none":
            return set(self.saved), set()
        keep = KEEP_CLASSES[policy]
        kept, recomputed = set(self.X), set()
        stack = list(self.saved)
        ops, storages = self.tr.ops, self.st
        while stack:
            sid = stack.pop()
            if sid in kept or sid in recomputed or sid in self.excluded or sid not in self.alloc:
                continue   # the input (kept already), parameters, shared tables
            if self.cls.get(sid) in keep:
                kept.add(sid)
                continue
            recomputed.add(sid)
            stack.extend(ops[storages[sid].producer].ins)
        return kept, recomputed

    def producers(self, sids) -> list:
        seen, out = set(), []
        for sid in sids:
            p = self.st[sid].producer
            if p >= 0 and p not in seen:
                seen.add(p)
                out.append(self.tr.ops[p])
        return out


def _spans(tr, include, t0: int, t1: int) -> list:
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


def _live_curve(tr, include, t0: int, t1: int, extra=(), spans=None):
    """Bytes alive after each op t in [t0, t1] among the storages for which include(sid) holds (or the
    precomputed ``spans``), plus the ``extra`` spans (alloc, free, nbytes, is_trace_dtype); split
    (trace-dtype bytes, other bytes). Returns [(t, dtype_bytes, other_bytes), ...]."""
    if spans is None:
        spans = _spans(tr, include, t0, t1)
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


def _consumers(tr) -> dict:
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


def _alive_before(tr, include, t: int) -> tuple[int, int]:
    """(trace-dtype bytes, other bytes) allocated before op t and still alive during it: what a phase
    starting at t inherits (a temporary freed by op t itself is not inherited)."""
    e = o = 0
    for a, f, n, is_e in _spans(tr, include, t, t):
        if a < t and f > t:
            if is_e:
                e += n
            else:
                o += n
    return e, o


def _peak(curve):
    return max(curve, key=lambda c: c[1] + c[2])


def _elems_of_bytes(e_bytes: float, other_bytes: float) -> Elems:
    return Elems(e_bytes / 2, 0.0, other_bytes)


def measure(tr) -> dict:
    """Per-sequence quantities of the last decoder layer and of the model outside the layers."""
    la = LayerAnalysis(tr)
    ops = tr.ops
    out: dict[str, float] = {}
    consumers = _consumers(tr)

    def put(prefix: str, el: Elems):
        out[prefix + ".other"], out[prefix + ".kv"], out[prefix + ".fixed"] = el.other, el.kv, el.fixed

    # --- kept / recomputed per policy ---
    none_attn = [s for s in la.saved if la.side(s) == "attn"]
    none_mlp = [s for s in la.saved if la.side(s) == "mlp"]
    put("mlp_inner", la.size(none_mlp))
    for policy in CHECKPOINTING_POLICIES:
        kept, recomputed = la.policy_sets(policy)
        put(f"kept_attn.{policy}", la.size([s for s in kept if la.side(s) == "attn"]))
        put(f"kept_mlp.{policy}", la.size([s for s in kept if la.side(s) == "mlp"]))
        redo = [s for s in recomputed if s in la.saved]
        put(f"mlp_live.{policy}", la.size([s for s in redo if la.side(s) == "mlp"]))
        redo_ops = [o for o in la.producers(recomputed) if o.kind == "other"]
        out[f"pw_recompute.{policy}"] = fused_traffic(tr, sorted(redo_ops, key=lambda o: o.idx), consumers) / 2
    for cls in CLASSES:
        el = la.size([s for s in la.saved if la.cls[s] == cls])
        out[f"class.{cls}"] = el.other * 2 + el.kv * 2 + el.fixed
    out["norm_fp32_bytes"] = sum(la.st[s].nbytes for s in la.saved
                                 if la.cls[s] == "norm" and la.st[s].dtype != tr.dtype and la.st[s].nbytes > 8 * la.S)
    out["saved_none_bytes"] = sum(la.st[s].nbytes for s in la.saved if s >= 0)   # what a trace holds
    out["virtual_bytes"] = sum(la.st[s].nbytes for s in la.saved if s < 0)    # the Ulysses-only copy
    out["shared_saved_bytes"] = sum(tr.storages[s].nbytes for s in la.shared)

    # --- FLOPs ---
    out["mm_fwd"] = sum(o.flops for o in la.fwd if o.kind == "matmul")
    out["mlp_mm_fwd"] = sum(o.flops for o in la.fwd if o.kind == "matmul" and la.in_mlp(o.module))
    out["attn_fwd"] = sum(o.flops for o in la.fwd if o.kind == "attention")
    out["mm_bwd"] = sum(o.flops for o in la.bwd if o.kind == "matmul")
    out["attn_bwd"] = sum(o.flops for o in la.bwd if o.kind == "attention_backward")
    out["qproj_fwd"] = _qproj_flops(la)

    # --- pointwise traffic: fused regions (what a compiler's fused kernels move), eager for reference ---
    pw_fwd_ops = [o for o in la.fwd if o.kind == "other"]
    pw_bwd_ops = [o for o in la.bwd if o.kind == "other"]
    out["pw_fwd"] = fused_traffic(tr, pw_fwd_ops, consumers) / 2
    out["pw_bwd"] = fused_traffic(tr, pw_bwd_ops, consumers) / 2
    out["pw_mlp"] = fused_traffic(tr, [o for o in pw_fwd_ops if la.in_mlp(o.module)], consumers) / 2
    out["pw_fwd_eager"] = sum(o.rw_bytes for o in pw_fwd_ops) / 2
    out["pw_bwd_eager"] = sum(o.rw_bytes for o in pw_bwd_ops) / 2

    # --- backward working set of the layer, from the live-bytes replay of the (policy none) trace ---
    # MLP phase: from the start of the layer's backward through the MLP's; attention phase: the rest (the
    # norms' backward included: HF's fp32 RMSNorm backward can be the layer's peak). The working set is
    # every storage that is neither a parameter, a gradient of one, an input nor saved for backward (those
    # are counted as kept), relative to what was alive just before the layer's backward started (the
    # logits, ...) except the gradient arriving at the layer's output, which belongs to the phase.
    every_saved = set(tr.saved)
    skip = la.excluded | tr.grad_sids | every_saved

    def working(sid):
        return sid not in skip

    grad_in = tr.layer_grad_in.get(la.name, 0)
    h = tr.storages[next(iter(la.X))].shape[-1] if la.X else 0
    out["grad_in"] = grad_in
    if la.bwd:
        start, stop = la.bwd[0].idx, la.bwd[-1].idx
        mlp_ops = [o.idx for o in la.bwd if la.in_mlp(o.module)]
        split = max(mlp_ops) if mlp_ops else start - 1
        base_e, base_o = _alive_before(tr, working, start)
        base_e -= grad_in
        # flash attention's fp32 dq accumulator lives inside its backward kernel (invisible to the trace)
        acc = []
        for o in la.bwd:
            if o.kind == "attention_backward":
                call = next((c for c in la.sdpa if c.q in o.ins), la.sdpa[0])
                numel = 1
                for n in call.q_shape:
                    numel *= n
                acc.append((o.idx, o.idx + 1, FLASH_DQ_ACCUMULATOR * 2 * numel, False))
        end = len(ops) + 1
        windows = {"mlp": (start, split), "attn": (split + 1, stop)}
        layer_spans = _spans(tr, working, start, stop)
        grads_peak = {}
        for phase, (t0, t1) in windows.items():
            if t1 < t0:
                grads_peak[phase] = (t0, base_e, base_o)
                put(f"grads_{phase}", Elems())
                continue
            grads_peak[phase] = _peak(_live_curve(tr, working, t0, t1, acc, layer_spans))
            _, eb, ob = grads_peak[phase]
            put(f"grads_{phase}", Elems((eb - base_e) / 2, 0.0, ob - base_o))
        # recomputed attention-side tensors: alive from the start of the layer's backward until their
        # last backward user ran (when the policy-none trace released them)
        for policy in CHECKPOINTING_POLICIES:
            _, recomputed = la.policy_sets(policy)
            redo = [sid for sid in recomputed if sid in la.saved and la.side(sid) == "attn"]
            spans = [(start, la.st[sid].free if la.st[sid].free >= 0 else end, la.st[sid].nbytes,
                      la.st[sid].dtype == tr.dtype) for sid in redo]
            for phase, (t0, t1) in windows.items():
                key = "recompute_mlp_phase" if phase == "mlp" else "recompute_attn_phase"
                if t1 < t0 or not redo:
                    put(f"{key}.{policy}", Elems())
                    continue
                t, eb, ob = _peak(_live_curve(tr, working, t0, t1, acc + spans, layer_spans))
                alive = [sid for sid in redo if (la.st[sid].free if la.st[sid].free >= 0 else end) > t]
                kv = la.size(alive).kv
                _, we, wo = grads_peak[phase]
                put(f"{key}.{policy}", Elems((eb - we) / 2 - kv, kv, ob - wo))
    else:
        put("grads_mlp", Elems())
        put("grads_attn", Elems())
        for policy in CHECKPOINTING_POLICIES:
            put(f"recompute_mlp_phase.{policy}", Elems())
            put(f"recompute_attn_phase.{policy}", Elems())

    # --- outside the layers: head, loss, final norm ---
    V = tr.logits_shape[-1] if tr.logits_shape else 0
    in_any = lambda m: any(m == n or m.startswith(n + ".") for n in tr.layer_names)  # noqa: E731
    head = [o for o in ops[:tr.backward_start]
            if o.kind == "matmul" and not in_any(o.module) and o.out_shapes and o.out_shapes[0][-1] == V]
    if not head:
        raise ValueError("no LM-head matmul producing [.., vocab] logits found outside the decoder layers")
    head_idx = head[-1].idx
    out["head_mm_fwd"] = sum(o.flops for o in ops[:tr.backward_start] if o.kind == "matmul" and not in_any(o.module))
    layer_inputs = {s for v in tr.layer_inputs.values() for s in v}
    # kept outside the layers: what modules outside the layers read back from before the LM head (final
    # norm, the head's input, position indices), and what the layers read that was made outside them
    # (rotary tables, shared by every layer); not the layers' own inputs (counted per layer)
    final = []
    for sid, readers in tr.saved_by.items():
        st = tr.storages[sid]
        if sid in la.excluded or sid in layer_inputs or not 0 <= st.producer < head_idx:
            continue
        outside_reader = any(not in_any(m) for m in readers)
        made_outside = not in_any(ops[st.producer].module)
        if outside_reader or made_outside:
            final.append(sid)
    put("final", la.size(final))
    early_saved = {s for s in tr.saved if 0 <= tr.storages[s].producer < head_idx}
    skip_loss = la.excluded | tr.grad_sids | early_saved | layer_inputs

    def loss_working(sid):
        return sid not in skip_loss

    # the loss phase: from the LM head's forward to the start of the last layer's backward, on top of what
    # was alive before the head ran; what is still alive when the layers' backward starts is the logits
    # term (the model output keeps the logits referenced through the backward)
    layer_start = la.bwd[0].idx if la.bwd else len(ops)
    base_e, base_o = _alive_before(tr, loss_working, head_idx)
    _, eb, ob = _peak(_live_curve(tr, loss_working, head_idx, layer_start - 1))
    put("loss_peak", Elems((eb - base_e) / 2, 0.0, ob - base_o))
    end_e, end_o = _alive_before(tr, loss_working, layer_start)
    put("logits", Elems((end_e - base_e - grad_in) / 2, 0.0, end_o - base_o))
    loss_fwd = [o for o in ops[head_idx:tr.backward_start] if o.kind == "other"]
    norm_mods = {m for m, c in tr.module_classes.items() if "norm" in c.lower()}
    loss_bwd = [o for o in ops[tr.backward_start:layer_start]
                if o.kind == "other" and not in_any(o.module) and o.module not in norm_mods]
    out["loss_pw_fwd"] = fused_traffic(tr, loss_fwd, consumers)
    out["loss_pw_bwd"] = fused_traffic(tr, loss_bwd, consumers)
    out["loss_pw_fwd_eager"] = sum(o.rw_bytes for o in loss_fwd)
    out["loss_pw_bwd_eager"] = sum(o.rw_bytes for o in loss_bwd)

    # --- structure (not fitted) ---
    c = la.sdpa[0]
    out["n_heads"], out["n_kv_heads"], out["head_dim"] = c.q_shape[1], c.k_shape[1], c.q_shape[3]
    out["v_head_dim"] = c.v_shape[3]
    out["sdpa_calls"] = len(la.sdpa)
    out["sdpa_causal"] = float(all(x.is_causal for x in la.sdpa))
    out["sdpa_mask"] = float(any(x.has_mask for x in la.sdpa))
    out["hidden"] = h
    out["vocab"] = V
    mlp_mm = [o for o in la.fwd if o.kind == "matmul" and la.in_mlp(o.module)]
    out["mlp_matmuls"] = len(mlp_mm)
    out["ffn_hidden"] = max((o.out_shapes[0][-1] for o in mlp_mm if o.out_shapes), default=0)
    return out


def _qproj_flops(la: LayerAnalysis) -> float:
    """FLOPs of the matmul that produces the query (walking back from SDPA's q through RoPE and views);
    a fused qkv projection is charged by the query's share of its output."""
    tr = la.tr
    c = la.sdpa[0]
    sid, seen = c.q, set()
    while sid not in seen:
        seen.add(sid)
        st = tr.storages[sid]
        if st.producer < 0:
            return 0.0
        op = tr.ops[st.producer]
        if op.kind == "matmul":
            qb, kb, vb = c.view_bytes
            total = qb + (kb if c.k == c.q else 0) + (vb if c.v == c.q else 0)
            share = qb / total if total else 1.0
            if op.outs and op.outs[0] in (c.k, c.v) and op.outs[0] != c.q:
                share = 1.0
            return op.flops * share
        floats = [i for i in op.ins if i in tr.storages and tr.storages[i].dtype == tr.dtype
                  and i not in tr.param_sids and i not in tr.buffer_sids]
        if not floats:
            return 0.0
        sid = max(floats, key=lambda i: tr.storages[i].nbytes)
    return 0.0


# --------------------------------------------------------------------------------------------------
# Fitting and assembling
# --------------------------------------------------------------------------------------------------

FLOP_KEYS = ("mm_fwd", "mlp_mm_fwd", "attn_fwd", "mm_bwd", "attn_bwd", "qproj_fwd", "head_mm_fwd")
STRUCTURE_KEYS = ("n_heads", "n_kv_heads", "head_dim", "v_head_dim", "sdpa_calls", "sdpa_causal", "sdpa_mask",
                  "hidden", "vocab", "mlp_matmuls", "ffn_hidden")


def fit_measurements(seq_lens, measurements) -> tuple[dict, dict]:
    """({key: Fit}, {key: value}) over the traced sequence lengths: FLOPs as a*s + c*s^2, structure keys
    must agree across lengths, everything else as a + b*s."""
    fits, structure = {}, {}
    keys = measurements[0].keys()
    for key in keys:
        ys = [m[key] for m in measurements]
        if key in STRUCTURE_KEYS:
            if len(set(ys)) != 1:
                raise ValueError(f"{key} changes with the sequence length: {ys}")
            structure[key] = ys[0]
        elif key in FLOP_KEYS:
            fits[key] = fit_flops(seq_lens, ys)
        else:
            fits[key] = fit_linear(seq_lens, ys)
    return fits, structure


def _slope(fits, key) -> float:
    return clean(fits[key].coef[1])


def _elems(fits, prefix) -> Elems:
    return Elems(_slope(fits, prefix + ".other"), _slope(fits, prefix + ".kv"), _slope(fits, prefix + ".fixed"))


def build_profile(name: str, seq_lens, measurements, params: dict, n_layers: int, *, fingerprint: str = "",
                  versions: tuple = (), notes: tuple = (), checks: dict | None = None) -> ModelProfile:
    """Assemble a graph ModelProfile from per-sequence-length measurements of one layer."""
    fits, st = fit_measurements(seq_lens, measurements)
    h = int(st["hidden"])
    a, n_kv, d = int(st["n_heads"]), int(st["n_kv_heads"]), int(st["head_dim"])
    q_w, k_w = a * d, n_kv * d
    mm_lin, mm_quad = fits["mm_fwd"].coef
    attn_lin, attn_quad = fits["attn_fwd"].coef
    quad_fwd = mm_quad + attn_quad
    quad_bwd = fits["mm_bwd"].coef[1] + fits["attn_bwd"].coef[1]
    attn_bwd_factor = quad_bwd / quad_fwd if quad_fwd > 0 else 2.5
    mm_bwd_lin = fits["mm_bwd"].coef[0] + fits["attn_bwd"].coef[0]
    fwd_lin = mm_lin + attn_lin
    pw_fwd = _slope(fits, "pw_fwd")
    pw_bwd = _slope(fits, "pw_bwd")
    grads_mlp = _elems(fits, "grads_mlp")
    # the MLP phase's gradient working set, split the way the cost model scales it: the gradient arriving
    # at the layer (not shrunk by MLP tiling) and the rest (MLP tiling keeps 1/N of it)
    grad_in = Elems(_slope(fits, "grad_in") / 2)
    mlp_grads = Elems(grads_mlp.other - grad_in.other, grads_mlp.kv, grads_mlp.fixed)
    attn_grads = _elems(fits, "grads_attn")
    pols = CHECKPOINTING_POLICIES
    worst = max(fits.items(), key=lambda kv: kv[1].residual)
    fit_summary = tuple(sorted(((k, f.residual) for k, f in fits.items() if f.residual > 1e-12),
                               key=lambda kv: -kv[1]))
    n_params = n_layers * params["layer"] + params["other"]
    details = {
        "ffn_hidden": int(st["ffn_hidden"]), "gated_mlp": st["mlp_matmuls"] >= 3, "tied_embeddings": params["tied"],
        "qkv_bias": params["qkv_bias"], "v_head_dim": int(st["v_head_dim"]), "sdpa_calls": int(st["sdpa_calls"]),
        "sdpa_causal": bool(st["sdpa_causal"]), "sdpa_mask": bool(st["sdpa_mask"]),
        "seq_lens": tuple(seq_lens),
        "saved_by_class": tuple((c, _slope(fits, f"class.{c}")) for c in CLASSES),
        "shared_saved_bytes_per_token": _slope(fits, "shared_saved_bytes"),
        "norm_fp32_upcast": _slope(fits, "norm_fp32_bytes") > 0,
        "pointwise_eager_fwd_bytes_per_token": 2 * _slope(fits, "pw_fwd_eager"),
        "pointwise_eager_bwd_bytes_per_token": 2 * _slope(fits, "pw_bwd_eager"),
        "mm_bwd_over_fwd": clean_ratio(mm_bwd_lin / fwd_lin) if fwd_lin else 0.0,
    }
    if checks:
        details.update(checks)
    return ModelProfile(
        name=name, source="graph", n_layers=n_layers, hidden=h, n_heads=a, n_kv_heads=n_kv, head_dim=d,
        vocab=int(st["vocab"]),
        n_params=int(n_params), layer_params=int(params["layer"]), layer_small_params=int(params["layer_small"]),
        other_small_params=int(params["other_small"]), largest_other_params=int(params["largest_other"]),
        layer_matmul=clean(mm_lin / 2), mlp_matmul=clean(fits["mlp_mm_fwd"].coef[0] / 2),
        head_matmul=clean(fits["head_mm_fwd"].coef[0] / 2), qproj_matmul=clean(fits["qproj_fwd"].coef[0] / 2),
        attn_width=clean(quad_fwd / 2),
        kept_attn=tuple(_elems(fits, f"kept_attn.{p}") for p in pols),
        kept_mlp=tuple(_elems(fits, f"kept_mlp.{p}") for p in pols),
        recompute_mlp_phase=tuple(_elems(fits, f"recompute_mlp_phase.{p}") for p in pols),
        recompute_attn_phase=tuple(_elems(fits, f"recompute_attn_phase.{p}") for p in pols),
        mlp_live=tuple(_elems(fits, f"mlp_live.{p}") for p in pols),
        mlp_inner=_elems(fits, "mlp_inner"), mlp_grads=mlp_grads, mlp_phase_grads=grad_in, attn_grads=attn_grads,
        final=_elems(fits, "final"),
        logits=_elems(fits, "logits"), loss_peak=_elems(fits, "loss_peak"), loss_hidden_grad=Elems(float(h)),
        pw_layer_fwd=Elems(pw_fwd),
        pw_recompute=tuple(Elems(_slope(fits, f"pw_recompute.{p}")) for p in pols),
        pw_mlp_recompute=Elems(_slope(fits, "pw_mlp")),
        loss_pw_fwd=_slope(fits, "loss_pw_fwd"), loss_pw_bwd=_slope(fits, "loss_pw_bwd"),
        matmul_bwd_factor=clean_ratio(fits["mm_bwd"].coef[0] / mm_lin) if mm_lin else 2.0,
        attn_bwd_factor=clean_ratio(attn_bwd_factor),
        pw_bwd_factor=clean_ratio(pw_bwd / pw_fwd) if pw_fwd else 2.0,
        fingerprint=fingerprint, versions=tuple(versions), fit_residual=worst[1].residual, fit=fit_summary,
        notes=tuple(notes), details=tuple(sorted(details.items())),
    )
