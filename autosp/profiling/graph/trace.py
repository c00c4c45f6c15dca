"""Record one training step of a model under FakeTensorMode: every op, every storage, what autograd saves.

Nothing runs for real: FakeTensorMode gives every tensor a shape, a dtype and a storage identity but
no data, so a Llama-3.1-8B layer at 4k tokens costs milliseconds and no memory. One
:func:`trace_step` builds the model with ``n_layers`` decoder layers, runs forward (with labels, so the
model computes its own loss) and backward, and returns a :class:`StepTrace`:

- ``ops``: every aten op in order, with its kind (matmul / attention / view / embedding / other), the
  innermost module it ran in (forward: a module stack kept by global forward hooks; backward: the
  module whose forward created the autograd node being run, ``torch._C._current_autograd_node()``),
  forward or backward, its input and newly allocated storages, the bytes it moved and its FLOPs
  (:class:`torch.utils.flop_counter.FlopCounterMode`'s formulas; the CPU flash-attention kernel, which
  FlopCounterMode does not know, gets the same formula as the CUDA ones, halved when causal);
- ``storages``: every storage seen, with its size, dtype, the op that allocated it and the op index at
  which it was freed (a ``weakref.finalize`` on the fake storage), so live bytes over time can be
  replayed afterwards;
- ``saved``: the storages autograd saved for the backward (``torch.autograd.graph.saved_tensors_hooks``),
  de-duplicated by storage, with the forward op index at which they were saved and (``saved_by``) the
  modules whose autograd nodes read them back in the backward (the unpack hook runs inside the node:
  ``torch._C._current_autograd_node()``). An input is saved before its op runs and an output after,
  so the forward index alone cannot say which op saved a tensor; the reading node can;
- ``sdpa``: each scaled-dot-product-attention call with its q/k/v shapes and storages;
- parameter and buffer storages, the storages of each decoder layer's input, the parameter counts.

The analysis (what a layer keeps under each checkpointing policy, fits in the sequence length) lives
in :mod:`autosp.profiling.graph.analyze`; this module only records.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import weakref
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from autosp.contract.op_classes import attention_kind, is_matmul

aten = torch.ops.aten

TRACE_DTYPE = torch.bfloat16
"""Activations and parameters are traced in bf16 (the training dtype); tensors of any other dtype
(fp32 upcasts, logsumexp, integer indices) are reported as fixed bytes."""

CAUSAL_ATTENTION = "autosp_causal_sdpa"
"""The attention implementation registered with transformers for HF configs: SDPA with ``is_causal`` and
``enable_gqa`` and no mask (see :func:`_register_causal_attention`)."""

def _op_kind(name: str) -> str:
    """matmul / attention / attention_backward (the tables the compiler uses too) / embedding / other."""
    if is_matmul(name):
        return "matmul"
    attention = attention_kind(name)
    if attention:
        return attention
    if name in ("embedding", "embedding_dense_backward"):
        return "embedding"
    return "other"


# --------------------------------------------------------------------------------------------------
# FLOP formulas FlopCounterMode lacks: the CPU flash-attention kernel (what SDPA dispatches to on CPU)
# --------------------------------------------------------------------------------------------------

def _cpu_flash_fwd_flops(query_shape, key_shape, value_shape, dropout_p=0.0, is_causal=False, *args,
                         out_shape=None, **kwargs) -> int:
    flops = sdpa_flop_count(query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


def _cpu_flash_bwd_flops(grad_out_shape, query_shape, key_shape, value_shape, out_shape_=None, lse_shape=None,
                         dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
    flops = sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


FLOP_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_fwd_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_bwd_flops,
}


# --------------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------------

@dataclass
class Op:
    idx: int
    name: str          # overload packet name, e.g. "mm", "_to_copy"
    kind: str          # matmul / attention / attention_backward / embedding / view / other
    bwd: bool
    module: str        # innermost module ("<RootClass>.<dotted path>"), "" outside any module
    ins: tuple         # storage ids of tensor inputs (in argument order, repeats kept)
    in_bytes: tuple    # bytes of each input view (aligned with ins)
    outs: tuple        # storage ids of tensor outputs (aliases included)
    new: tuple         # storage ids this op allocated
    rw_bytes: int      # bytes read + written (0 for views)
    flops: int
    out_shapes: tuple = ()


@dataclass
class Storage:
    sid: int
    nbytes: int
    dtype: str
    shape: tuple
    producer: int      # op index, -1 if created outside the recorded step (parameters, inputs)
    alloc: int         # op index at which it appeared
    free: int = -1     # op index at which it was released, -1 if alive at the end


@dataclass
class SdpaCall:
    op: int
    q: int
    k: int
    v: int
    out: int
    aux: tuple                  # other outputs (logsumexp, ...)
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    view_bytes: tuple           # bytes of the q, k, v views (a fused qkv storage is split by these)
    is_causal: bool
    has_mask: bool


@dataclass
class StepTrace:
    seq_len: int
    batch: int
    n_layers: int
    dtype: str
    ops: list = field(default_factory=list)
    storages: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)          # sid -> [forward op index at the save, ...]
    saved_by: dict = field(default_factory=dict)       # sid -> {module of each backward node that read it}
    sdpa: list = field(default_factory=list)
    param_sids: set = field(default_factory=set)
    buffer_sids: set = field(default_factory=set)
    grad_sids: set = field(default_factory=set)
    input_sids: set = field(default_factory=set)
    layer_names: list = field(default_factory=list)    # module names of the decoder layers, in order
    layer_inputs: dict = field(default_factory=dict)   # layer name -> storage ids of its tensor inputs
    layer_grad_in: dict = field(default_factory=dict)  # layer name -> bytes of the gradient arriving at its output
    module_classes: dict = field(default_factory=dict)  # module name -> class name
    params: dict = field(default_factory=dict)         # counts, see _param_counts
    logits_shape: tuple = ()
    backward_start: int = 0                             # index of the first backward op


class _ModuleStack:
    """The modules running now (forward hooks) and, for the backward, which module created each autograd
    node: when a module's forward returns, the nodes reachable from its outputs that were created
    since it started (autograd sequence numbers) are labelled with its name, innermost first."""

    def __init__(self, names: dict):
        self.names = names          # id(module) -> name
        self.stack: list = []       # [(name, first sequence number)]
        self.node_module: dict = {}

    def pre(self, mod, args):
        name = self.names.get(id(mod))
        if name is not None:
            self.stack.append((name, torch._C._autograd._get_sequence_nr()))

    def post(self, mod, args, output):
        name = self.names.get(id(mod))
        if name is None or not self.stack or self.stack[-1][0] != name:
            return
        _, first = self.stack.pop()
        todo = [t.grad_fn for t in _tensors((output,) if not isinstance(output, (tuple, list)) else output)
                if t.grad_fn is not None]
        todo += [v.grad_fn for v in (output.values() if isinstance(output, dict) else ())
                 if isinstance(v, torch.Tensor) and v.grad_fn is not None]
        seen = set()
        while todo:
            node = todo.pop()
            if node in seen or type(node).__name__ == "AccumulateGrad" or node._sequence_nr() < first:
                continue
            seen.add(node)
            self.node_module.setdefault(node, name)   # a child labelled it first: keep the innermost
            todo.extend(n for n, _ in node.next_functions if n is not None)


def _tensors(values) -> list:
    """The tensors among ``values`` and inside their lists/tuples (one level: aten ops take no deeper)."""
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: StepTrace, modules: "_ModuleStack", flop_registry: dict):
        super().__init__()
        self.trace = trace
        self.modules = modules
        self.flop_registry = flop_registry
        self.live: dict[int, int] = {}   # storage _cdata -> sid
        self.next_sid = 0
        self.bwd = False
        self.suspended = False

    # storage identity ------------------------------------------------------------------------------
    def sid_of(self, t: torch.Tensor, producer: int = -1) -> tuple[int, bool]:
        st = t.untyped_storage()
        key = st._cdata
        sid = self.live.get(key)
        if sid is not None:
            return sid, False
        sid = self.next_sid
        self.next_sid += 1
        self.live[key] = sid
        now = len(self.trace.ops)
        self.trace.storages[sid] = Storage(sid=sid, nbytes=st.nbytes(), dtype=str(t.dtype).replace("torch.", ""),
                                           shape=tuple(t.shape), producer=producer, alloc=now)
        weakref.finalize(st, self._freed, key, sid)
        return sid, True

    def _freed(self, key, sid):
        if self.live.get(key) == sid:
            del self.live[key]
        rec = self.trace.storages.get(sid)
        if rec is not None and rec.free < 0:
            rec.free = len(self.trace.ops)

    def module(self) -> str:
        if self.bwd:
            node = torch._C._current_autograd_node()
            return self.modules.node_module.get(node, "") if node is not None else ""
        return self.modules.stack[-1][0] if self.modules.stack else ""

    # dispatch --------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.suspended or func.namespace == "prim":
            return func(*args, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__
        flat_in = _tensors(args) + _tensors(kwargs.values())
        ins = tuple(self.sid_of(t)[0] for t in flat_in)
        in_bytes = {}
        for t, sid in zip(flat_in, ins):
            in_bytes[sid] = max(in_bytes.get(sid, 0), t.numel() * t.element_size())
        out = func(*args, **kwargs)
        idx = len(self.trace.ops)
        flat_out = _tensors((out,))
        outs, new = [], []
        out_bytes = 0
        for t in flat_out:
            sid, is_new = self.sid_of(t, producer=idx)
            outs.append(sid)
            if is_new:
                new.append(sid)
                out_bytes += t.numel() * t.element_size()
        kind = _op_kind(name)
        if kind == "other" and flat_out and not new:
            kind = "view"
        rw = 0 if kind == "view" else sum(in_bytes.values()) + out_bytes
        formula = self.flop_registry.get(packet)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        self.trace.ops.append(Op(idx=idx, name=name, kind=kind, bwd=self.bwd, module=self.module(), ins=ins,
                                 in_bytes=tuple(t.numel() * t.element_size() for t in flat_in), outs=tuple(outs), new=tuple(new), rw_bytes=rw, flops=flops,
                                 out_shapes=tuple(tuple(t.shape) for t in flat_out)))
        if kind == "attention":
            self._record_sdpa(func, idx, args, kwargs, flat_in, ins, outs)
        return out

    def _record_sdpa(self, func, idx, args, kwargs, flat_in, ins, outs):
        names = [a.name for a in func._schema.arguments]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return
        sid = {id(t): s for t, s in zip(flat_in, ins)}
        mask = bound.get("attn_mask", bound.get("attn_bias"))
        self.trace.sdpa.append(SdpaCall(
            op=idx, q=sid[id(q)], k=sid[id(k)], v=sid[id(v)], out=outs[0], aux=tuple(outs[1:]),
            q_shape=tuple(q.shape), k_shape=tuple(k.shape), v_shape=tuple(v.shape),
            view_bytes=tuple(t.numel() * t.element_size() for t in (q, k, v)),
            is_causal=bool(bound.get("is_causal", False)), has_mask=isinstance(mask, torch.Tensor)))


# --------------------------------------------------------------------------------------------------
# Building the model
# --------------------------------------------------------------------------------------------------

def _register_causal_attention() -> None:
    """Register an attention implementation that is HF's SDPA path with no mask: ``is_causal=True`` and,
    for GQA, ``enable_gqa`` (no ``repeat_kv``). It is what a causal-LM training step runs when no 2-D
    padding mask is passed; HF's own "sdpa" would materialise an S x S mask under FakeTensorMode,
    because it cannot inspect fake position ids to rule out packed sequences. Not being in HF's mask
    registry, this implementation also makes the model skip building any mask."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if CAUSAL_ATTENTION in AttentionInterface._global_mapping:
        return

    def causal_sdpa(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register(CAUSAL_ATTENTION, causal_sdpa)


def load_hf_config(path: str):
    """A transformers config from a config.json on disk (a file or a directory holding one); no download."""
    from transformers import AutoConfig

    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if "model_type" not in data:
        raise ValueError(f"{path} has no model_type; is it a Hugging Face config.json?")
    data.pop("architectures", None)
    model_type = data.pop("model_type")
    for key in ("_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        data.pop(key, None)
    return AutoConfig.for_model(model_type, **data)


def hf_builder(config):
    """A ``build(n_layers)`` for a transformers config: AutoModelForCausalLM.from_config with the causal
    SDPA implementation, no KV cache, ``n_layers`` decoder layers, bf16; call it under FakeTensorMode."""
    import copy

    from transformers import AutoModelForCausalLM

    _register_causal_attention()

    def build(n_layers: int):
        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers = n_layers
        for key in ("layer_types", "mlp_layer_types"):
            value = getattr(cfg, key, None)
            if isinstance(value, (list, tuple)) and len(value) > n_layers:
                setattr(cfg, key, list(value[:n_layers]))
        cfg.use_cache = False
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=CAUSAL_ATTENTION, dtype=TRACE_DTYPE)
        return model

    return build


def full_layers_of_config(config) -> int:
    return int(config.num_hidden_layers)


def load_entry_point(spec: str):
    """``package.module:function`` -> the function."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"entry point {spec!r} must look like package.module:function")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"entry point {spec!r} is not callable")
    return obj


_LAYER_KWARGS = ("num_layers", "n_layers", "num_hidden_layers")


def decoder_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """The largest ModuleList whose children all have the same class (the decoder layers)."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            classes = {type(m) for m in mod}
            if len(classes) == 1:
                size = sum(p.numel() for p in mod.parameters())
                if best is None or size > best[2]:
                    best = (name, mod, size)
    return None if best is None else (best[0], best[1])


def factory_builder(factory):
    """A ``build(n_layers)`` for an nn.Module factory. If the factory takes ``num_layers`` (or
    ``n_layers`` / ``num_hidden_layers``) it is passed; otherwise the full model is built and its decoder
    stack (the largest ModuleList of same-class modules) is cut to ``n_layers``."""
    params = inspect.signature(factory).parameters
    layer_kw = next((k for k in _LAYER_KWARGS if k in params), None)

    def build(n_layers: int):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(TRACE_DTYPE)   # (module.to() cannot swap fake parameters)
        try:
            model = factory(**{layer_kw: n_layers}) if layer_kw is not None else factory()
        finally:
            torch.set_default_dtype(previous)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"the factory returned {type(model).__name__}, not an nn.Module")
        if layer_kw is None:
            stack = decoder_stack(model)
            if stack is None:
                raise ValueError("the factory's model has no ModuleList of decoder layers to cut; give the factory "
                                 "a num_layers argument")
            name, layers = stack
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], torch.nn.ModuleList(list(layers)[:n_layers]))
        return model

    def full_layers() -> int:
        """The real layer count: the default of the factory's layer argument, else the built model's stack."""
        if layer_kw is not None:
            default = params[layer_kw].default
            if default is inspect.Parameter.empty or not isinstance(default, int):
                raise ValueError(f"the factory's {layer_kw} argument needs an integer default (the real layer count)")
            return default
        with FakeTensorMode():
            stack = decoder_stack(factory())
        if stack is None:
            raise ValueError("the factory's model has no ModuleList of decoder layers")
        return len(stack[1])

    return build, full_layers


# --------------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------------

def _loss_of(output, labels):
    """The loss from a model output: ``.loss``, ``["loss"]``, a scalar tensor, or logits [B, S, V]
    (then the HF causal-LM loss: shift by one, fp32 cross-entropy)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor):
        if output.dim() == 0:
            loss = output
        elif output.dim() == 3:
            logits = output.float()
            shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), shift.reshape(-1),
                                                     ignore_index=-100)
    if loss is None:
        raise ValueError("the model output has no loss; return a scalar loss, an object with .loss, or logits "
                         "[batch, seq, vocab]")
    return loss


def _logits_of(output):
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, torch.Tensor) and output.dim() == 3:
        logits = output
    return tuple(logits.shape) if isinstance(logits, torch.Tensor) else ()


def _param_counts(model: torch.nn.Module, layer_prefix: str) -> dict:
    """Parameter counts, de-duplicated by storage (tied embeddings count once)."""
    seen = {}
    tied = False
    for name, p in model.named_parameters(remove_duplicate=False):
        key = p.untyped_storage()._cdata
        if key in seen:
            tied = True
            continue
        seen[key] = (name, p)
    layer = small_layer = other = small_other = largest_other = 0
    per_layer: dict[str, int] = {}
    for name, p in seen.values():
        n = p.numel()
        if layer_prefix and name.startswith(layer_prefix + "."):
            idx = name[len(layer_prefix) + 1:].split(".", 1)[0]
            per_layer[idx] = per_layer.get(idx, 0) + n
            layer += n
            if p.dim() <= 1:
                small_layer += n
        else:
            other += n
            largest_other = max(largest_other, n)
            if p.dim() <= 1:
                small_other += n
    shapes = {name: tuple(p.shape) for name, p in seen.values()}
    return {"total": layer + other, "layers": layer, "layers_small": small_layer, "other": other,
            "other_small": small_other, "largest_other": largest_other, "per_layer": per_layer, "tied": tied,
            "shapes": shapes, "layer_prefix": layer_prefix}


RECURRENT_LAYER_SUFFIXES = ("GatedDeltaNet", "Mamba", "MambaMixer", "Mamba2Mixer", "ShortConv", "LinearAttention")
"""Class-name endings of the sequence mixers a graph profile does not describe: linear-attention and state-space
layers, whose recurrence transformers runs as a Python loop (its torch fallback) that autosp replaces with its own op
(compiler/linear_attention.py) and whose costs a trace of one layer cannot attribute to 'attention'."""


def refuse_linear_attention(model: torch.nn.Module) -> None:
    """ValueError naming the first linear-attention / state-space module of ``model`` (the graph profile classifies
    a layer's sequence mixer as softmax attention only): a Qwen3-Next / Qwen3.5 hybrid is priced from its config.json
    by the formulas of cost_models/linear_attention.py instead."""
    for name, module in model.named_modules():
        if type(module).__name__.endswith(RECURRENT_LAYER_SUFFIXES):
            raise ValueError(f"{name} ({type(module).__name__}) is a linear-attention / state-space layer, which a "
                             "graph profile does not describe; plan the model's config.json instead (a Qwen3-Next or "
                             "Qwen3.5 hybrid is priced from it as the compiler runs its Gated DeltaNet layers)")


def trace_step(build, n_layers: int, seq_len: int, batch: int = 1, vocab_hint: int | None = None) -> StepTrace:
    """Build the model with ``n_layers`` layers under FakeTensorMode and record one forward + backward
    at ``seq_len`` tokens. The model output (and its logits) stays referenced through the backward, as
    in a training loop that keeps ``outputs`` around."""
    trace = StepTrace(seq_len=seq_len, batch=batch, n_layers=n_layers, dtype=str(TRACE_DTYPE).replace("torch.", ""))
    with FakeTensorMode(allow_non_fake_inputs=False) as fake:
        model = build(n_layers)
        model.train()
        refuse_linear_attention(model)
        stack = decoder_stack(model)
        layer_prefix = stack[0] if stack else ""
        trace.params = _param_counts(model, layer_prefix)
        vocab = vocab_hint or getattr(getattr(model, "config", None), "vocab_size", None) or 2
        ids = torch.randint(0, vocab, (batch, seq_len))
        root = type(model).__name__
        names = {id(m): (f"{root}.{n}" if n else root) for n, m in model.named_modules()}
        modules = _ModuleStack(names)
        # FlopCounterMode's formula table (plus the CPU flash-attention kernel); the recorder applies it per op,
        # so FLOPs are attributed to modules and to the forward or backward.
        flop_counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
        rec = _Recorder(trace, modules, flop_counter.flop_registry)
        for p in model.parameters():
            trace.param_sids.add(rec.sid_of(p)[0])
        for b in model.buffers():
            trace.buffer_sids.add(rec.sid_of(b)[0])
        trace.input_sids.add(rec.sid_of(ids)[0])

        hooks = _layer_hooks(trace, model, stack, rec)

        root = type(model).__name__
        trace.module_classes = {(f"{root}.{n}" if n else root): type(m).__name__ for n, m in model.named_modules()}

        pack, unpack = _saved_tensor_hooks(trace, rec, modules)

        # every gradient that reaches a parameter (a tied weight gets several before they are summed) is
        # a parameter gradient, counted with the model states, not with the activations
        def grad_seen(grad):
            trace.grad_sids.add(rec.sid_of(grad)[0])

        for p in model.parameters():
            if p.requires_grad:
                hooks.append(p.register_hook(grad_seen))
        hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(modules.pre))
        hooks.append(torch.nn.modules.module.register_module_forward_hook(modules.post))
        try:
            with rec, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                output = model(input_ids=ids, labels=ids)
                loss = _loss_of(output, ids)
                trace.logits_shape = _logits_of(output)
                rec.bwd = True
                trace.backward_start = len(trace.ops)
                loss.backward()
            _mark_weight_gradients(trace, model, rec)
        finally:
            for h in hooks:
                h.remove()
        del output, loss, model, ids

    del fake
    return trace


def _layer_hooks(trace: StepTrace, model, stack, rec) -> list:
    """Hooks that record each decoder layer's inputs and the gradient arriving at its output."""
    hooks = []
    if stack is not None:
        root = type(model).__name__
        for i, layer in enumerate(stack[1]):
            lname = f"{root}.{stack[0]}.{i}"
            trace.layer_names.append(lname)

            def pre(mod, args, kwargs, lname=lname):
                tensors = [a for a in tree_flatten((args, kwargs))[0]
                           if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]
                trace.layer_inputs[lname] = tuple(rec.sid_of(t)[0] for t in tensors)

            def bwd_pre(mod, grad_output, lname=lname):
                trace.layer_grad_in[lname] = sum(g.numel() * g.element_size() for g in grad_output
                                                 if isinstance(g, torch.Tensor))

            hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
            hooks.append(layer.register_full_backward_pre_hook(bwd_pre))
    return hooks


def _saved_tensor_hooks(trace: StepTrace, rec, modules):
    """(pack, unpack) for ``saved_tensors_hooks``: which op saved each storage, and which module read it back."""
    def pack(t):
        rec.suspended = True
        try:
            sid = rec.sid_of(t)[0]
            trace.saved.setdefault(sid, []).append(len(trace.ops) - 1)
            return sid, t.detach()   # detached: no reference cycle through the node saving its own output
        finally:
            rec.suspended = False

    def unpack(packed):
        sid, t = packed
        node = torch._C._current_autograd_node()
        trace.saved_by.setdefault(sid, set()).add(modules.node_module.get(node, "") if node is not None else "")
        return t

    return pack, unpack


def _mark_weight_gradients(trace: StepTrace, model, rec) -> None:
    """After the backward: the storages that are parameter gradients (model states, not activations)."""
    for p in model.parameters():
        if p.grad is not None:
            sid = rec.live.get(p.grad.untyped_storage()._cdata)
            if sid is not None:
                trace.grad_sids.add(sid)
    # Parameter-shaped tensors made in the backward are weight gradients (a tied weight's first
    # gradient waits in the engine's buffer for the second before reaching the hook): model states,
    # constant in the sequence length. (The traced lengths are not model widths, so no activation
    # has a parameter's shape.)
    param_shapes = {tuple(p.shape) for p in model.parameters()}
    for sid, st in trace.storages.items():
        if st.producer >= trace.backward_start and st.shape in param_shapes:
            trace.grad_sids.add(sid)


__all__ = ["CAUSAL_ATTENTION", "FLOP_FORMULAS", "TRACE_DTYPE", "Op", "SdpaCall", "StepTrace", "Storage",
           "decoder_stack", "factory_builder", "full_layers_of_config", "hf_builder", "load_entry_point",
           "load_hf_config", "trace_step"]
