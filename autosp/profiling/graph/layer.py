"""The tensors one decoder layer of a recorded training step saves for its backward, classified by the op
that produced them, and what each checkpointing policy keeps or recomputes of them.

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

from autosp.contract.op_classes import KEEP_CLASSES
from autosp.cost_models.profile import Elems

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

    # classes ---------------------------------------------------------------------------------------
    def _classify(self):
        ops = self.tr.ops
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


__all__ = ["CLASSES", "FLASH_DQ_ACCUMULATOR", "KEEP_CLASSES", "LAYOUT_OPS", "LayerAnalysis"]
