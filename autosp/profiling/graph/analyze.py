"""From recorded training steps to a :class:`~autosp.cost_models.profile.ModelProfile`.

:func:`measure` reads one :class:`~autosp.profiling.graph.trace.StepTrace` and returns the
quantities of the last decoder layer (and of what lies outside the layers) at that sequence length,
as a flat ``{name: value}`` of per-sequence totals; :mod:`.layer` classifies the layer's saved tensors
and applies the checkpointing policies, :mod:`.liveness` follows memory over time, and
:func:`autosp.profiling.graph.assemble.build_profile` fits each quantity over the traced
sequence lengths and assembles the profile. Plain Python: it needs the records, not torch.
"""

from __future__ import annotations

from autosp.profiling.graph import liveness as live
from autosp.profiling.graph.layer import CLASSES, FLASH_DQ_ACCUMULATOR, LayerAnalysis
from autosp.cost_models.profile import Elems
from autosp.contract.specs import CHECKPOINTING_POLICIES


def measure(tr) -> dict:
    """Per-sequence quantities of the last decoder layer and of the model outside the layers."""
    la = LayerAnalysis(tr)
    out: dict[str, float] = {}
    consumers = live.consumers_of(tr)
    _kept_per_policy(tr, la, consumers, out)
    _flops(la, out)
    _pointwise(tr, la, consumers, out)
    _backward_working_set(tr, la, out)
    _outside_layers(tr, la, consumers, out)
    _structure(tr, la, out)
    return out


def _put(out: dict, prefix: str, el: Elems) -> None:
    out[prefix + ".other"], out[prefix + ".kv"], out[prefix + ".fixed"] = el.other, el.kv, el.fixed


def _kept_per_policy(tr, la: LayerAnalysis, consumers, out: dict) -> None:
    """What each checkpointing policy keeps and recomputes, by side (attention, MLP) and by tensor class."""
    none_mlp = [s for s in la.saved if la.side(s) == "mlp"]
    _put(out, "mlp_inner", la.size(none_mlp))
    for policy in CHECKPOINTING_POLICIES:
        kept, recomputed = la.policy_sets(policy)
        _put(out, f"kept_attn.{policy}", la.size([s for s in kept if la.side(s) == "attn"]))
        _put(out, f"kept_mlp.{policy}", la.size([s for s in kept if la.side(s) == "mlp"]))
        redo = [s for s in recomputed if s in la.saved]
        _put(out, f"mlp_live.{policy}", la.size([s for s in redo if la.side(s) == "mlp"]))
        redo_ops = [o for o in la.producers(recomputed) if o.kind == "other"]
        out[f"pw_recompute.{policy}"] = live.fused_traffic(tr, sorted(redo_ops, key=lambda o: o.idx), consumers) / 2
    for cls in CLASSES:
        el = la.size([s for s in la.saved if la.cls[s] == cls])
        out[f"class.{cls}"] = el.other * 2 + el.kv * 2 + el.fixed
    out["norm_fp32_bytes"] = sum(la.st[s].nbytes for s in la.saved
                                 if la.cls[s] == "norm" and la.st[s].dtype != tr.dtype and la.st[s].nbytes > 8 * la.S)
    out["saved_none_bytes"] = sum(la.st[s].nbytes for s in la.saved if s >= 0)   # what a trace holds
    out["virtual_bytes"] = sum(la.st[s].nbytes for s in la.saved if s < 0)    # the Ulysses-only copy
    out["shared_saved_bytes"] = sum(tr.storages[s].nbytes for s in la.shared)


def _flops(la: LayerAnalysis, out: dict) -> None:
    """The layer's matmul and attention FLOPs, forward and backward."""
    out["mm_fwd"] = sum(o.flops for o in la.fwd if o.kind == "matmul")
    out["mlp_mm_fwd"] = sum(o.flops for o in la.fwd if o.kind == "matmul" and la.in_mlp(o.module))
    out["attn_fwd"] = sum(o.flops for o in la.fwd if o.kind == "attention")
    out["mm_bwd"] = sum(o.flops for o in la.bwd if o.kind == "matmul")
    out["attn_bwd"] = sum(o.flops for o in la.bwd if o.kind == "attention_backward")
    out["qproj_fwd"] = _qproj_flops(la)


def _pointwise(tr, la: LayerAnalysis, consumers, out: dict) -> None:
    """Pointwise traffic: fused regions (what a compiler's fused kernels move), eager for reference."""
    pw_fwd_ops = [o for o in la.fwd if o.kind == "other"]
    pw_bwd_ops = [o for o in la.bwd if o.kind == "other"]
    out["pw_fwd"] = live.fused_traffic(tr, pw_fwd_ops, consumers) / 2
    out["pw_bwd"] = live.fused_traffic(tr, pw_bwd_ops, consumers) / 2
    out["pw_mlp"] = live.fused_traffic(tr, [o for o in pw_fwd_ops if la.in_mlp(o.module)], consumers) / 2
    out["pw_fwd_eager"] = sum(o.rw_bytes for o in pw_fwd_ops) / 2
    out["pw_bwd_eager"] = sum(o.rw_bytes for o in pw_bwd_ops) / 2


def _backward_working_set(tr, la: LayerAnalysis, out: dict) -> None:
    """The backward working set of the layer, from the live-bytes replay of the (policy none) trace.

    MLP phase: from the start of the layer's backward through the MLP's; attention phase: the rest (the
    norms' backward included: HF's fp32 RMSNorm backward can be the layer's peak). The working set is
    every storage that is neither a parameter, a gradient of one, an input nor saved for backward (those
    are counted as kept), relative to what was alive just before the layer's backward started (the
    logits, ...) except the gradient arriving at the layer's output, which belongs to the phase."""
    ops = tr.ops
    every_saved = set(tr.saved)
    skip = la.excluded | tr.grad_sids | every_saved

    def working(sid):
        return sid not in skip

    grad_in = tr.layer_grad_in.get(la.name, 0)
    out["grad_in"] = grad_in
    if la.bwd:
        start, stop = la.bwd[0].idx, la.bwd[-1].idx
        mlp_ops = [o.idx for o in la.bwd if la.in_mlp(o.module)]
        split = max(mlp_ops) if mlp_ops else start - 1
        base_e, base_o = live.alive_before(tr, working, start)
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
        layer_spans = live.alive_spans(tr, working, start, stop)
        grads_peak = {}
        for phase, (t0, t1) in windows.items():
            if t1 < t0:
                grads_peak[phase] = (t0, base_e, base_o)
                _put(out, f"grads_{phase}", Elems())
                continue
            grads_peak[phase] = live.peak(live.live_curve(tr, working, t0, t1, acc, layer_spans))
            _, eb, ob = grads_peak[phase]
            _put(out, f"grads_{phase}", Elems((eb - base_e) / 2, 0.0, ob - base_o))
        # recomputed tensors: alive from the start of the layer's backward until their last backward user ran
        # (when the policy-none trace released them). The MLP phase's peak is taken with the MLP's own
        # recomputed tensors in the curve too, and ``mlp_live`` is what of them is alive at that peak: eager
        # autograd frees the down projection's input before the SiLU and product gradients exist, so the
        # size of all of them plus the gradients' peak is a sum of maxima at different moments.
        free_at = {sid: la.st[sid].free if la.st[sid].free >= 0 else end for sid in la.saved}
        for policy in CHECKPOINTING_POLICIES:
            _, recomputed = la.policy_sets(policy)
            redo = [sid for sid in recomputed if sid in la.saved and la.side(sid) == "attn"]
            mlp_redo = [sid for sid in recomputed if sid in la.saved and la.side(sid) == "mlp"]
            spans = [(start, free_at[sid], la.st[sid].nbytes, la.st[sid].dtype == tr.dtype) for sid in redo]
            mlp_spans = [(start, free_at[sid], la.st[sid].nbytes, la.st[sid].dtype == tr.dtype) for sid in mlp_redo]
            for phase, (t0, t1) in windows.items():
                key = "recompute_mlp_phase" if phase == "mlp" else "recompute_attn_phase"
                own = mlp_spans if phase == "mlp" else []
                if t1 < t0 or not (redo or own):
                    _put(out, f"{key}.{policy}", Elems())
                    continue
                t, eb, ob = live.peak(live.live_curve(tr, working, t0, t1, acc + spans + own, layer_spans))
                kv = la.size([sid for sid in redo if free_at[sid] > t]).kv
                mlp_live = la.size([sid for sid in mlp_redo if free_at[sid] > t]) if own else Elems()
                _, we, wo = grads_peak[phase]
                _put(out, f"{key}.{policy}", Elems((eb - we) / 2 - kv - mlp_live.other - mlp_live.kv, kv,
                                                   ob - wo - mlp_live.fixed))
                if own:
                    _put(out, f"mlp_live.{policy}", mlp_live)
    else:
        _put(out, "grads_mlp", Elems())
        _put(out, "grads_attn", Elems())
        for policy in CHECKPOINTING_POLICIES:
            _put(out, f"recompute_mlp_phase.{policy}", Elems())
            _put(out, f"recompute_attn_phase.{policy}", Elems())



def _outside_layers(tr, la: LayerAnalysis, consumers, out: dict) -> None:
    """Outside the layers: the LM head, the loss and the final norm."""
    ops = tr.ops
    grad_in = out["grad_in"]
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
    _put(out, "final", la.size(final))
    early_saved = {s for s in tr.saved if 0 <= tr.storages[s].producer < head_idx}
    skip_loss = la.excluded | tr.grad_sids | early_saved | layer_inputs

    def loss_working(sid):
        return sid not in skip_loss

    # the loss phase: from the LM head's forward to the start of the last layer's backward, on top of what
    # was alive before the head ran; what is still alive when the layers' backward starts is the logits
    # term (the model output keeps the logits referenced through the backward)
    layer_start = la.bwd[0].idx if la.bwd else len(ops)
    base_e, base_o = live.alive_before(tr, loss_working, head_idx)
    _, eb, ob = live.peak(live.live_curve(tr, loss_working, head_idx, layer_start - 1))
    _put(out, "loss_peak", Elems((eb - base_e) / 2, 0.0, ob - base_o))
    end_e, end_o = live.alive_before(tr, loss_working, layer_start)
    _put(out, "logits", Elems((end_e - base_e - grad_in) / 2, 0.0, end_o - base_o))
    loss_fwd = [o for o in ops[head_idx:tr.backward_start] if o.kind == "other"]
    norm_mods = {m for m, c in tr.module_classes.items() if "norm" in c.lower()}
    loss_bwd = [o for o in ops[tr.backward_start:layer_start]
                if o.kind == "other" and not in_any(o.module) and o.module not in norm_mods]
    out["loss_pw_fwd"] = live.fused_traffic(tr, loss_fwd, consumers)
    out["loss_pw_bwd"] = live.fused_traffic(tr, loss_bwd, consumers)
    out["loss_pw_fwd_eager"] = sum(o.rw_bytes for o in loss_fwd)
    out["loss_pw_bwd_eager"] = sum(o.rw_bytes for o in loss_bwd)


def _structure(tr, la: LayerAnalysis, out: dict) -> None:
    """The layer's shapes (not fitted)."""
    h = tr.storages[next(iter(la.X))].shape[-1] if la.X else 0
    V = tr.logits_shape[-1] if tr.logits_shape else 0
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


__all__ = ["measure"]
