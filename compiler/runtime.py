"""The SP training engine: DeepSpeed underneath, the compiled SP graph inside, exact semantics around.

:class:`SPEngine` is what ``autosp.compile`` returns::

    loss = engine(input_ids=ids, labels=labels)   # every rank passes the FULL batch; the global loss
    engine.backward(loss)
    engine.step()

Packed documents: ``engine(input_ids=ids, labels=labels, position_ids=pos)`` with ``pos`` restarting at 0
for every document (Hugging Face's ``DataCollatorWithFlattening``), or ``seq_lens=`` / ``cu_seq_lens=``
instead of ``pos``; each document trains causally on its own (:mod:`autosp.compiler.attention.documents`).
The engine compiles its attention as span-restricted ops ("span mode") when ``autosp.CompileOptions(packed=True)``
was given, when the model has sliding-window layers, or when its first batch is packed.

Each call shards the batch for this rank (:mod:`autosp.compiler.inputs`), records the lengths the passes
need in the :class:`~autosp.compiler.context.SPContext`, and calls the DeepSpeed engine, whose module
was compiled with the autosp backend (:mod:`autosp.compiler.backend`) by ``DeepSpeedEngine.compile``.

Gradient reduction. DeepSpeed is given every one of the dp x sp ranks as a data-parallel rank (no
mpu, no ``sequence_parallel_size``): parameters are replicated across an SP group exactly as across DP
replicas, so one uniform rule covers ZeRO 0, 1, 2 and 3: DeepSpeed averages gradients over all W ranks,
and the loss pass makes each rank's gradient W * d(local token-loss sum) / N_global, whose average is the
single-process gradient. ZeRO partitions states over all W ranks, which is what the cost model assumes.

Safety nets that turn silent wrong results into errors:

- during the call, ``torch.nn.functional.scaled_dot_product_attention`` is replaced by a wrapper that
  refuses to run outside compiled code: attention that escaped the SP graph (an eager fallback after a
  graph break or a recompile limit) would attend over the local shard only;
- the custom ops count their calls: each forward must run the loss all-reduce exactly once, at least one
  all-to-all (unless the SP group is all ring: no Ulysses ranks) and, with a ring, at least one ring
  attention.

Gradient norm and clipping. At ZeRO 1-3 DeepSpeed's optimizer computes the global gradient norm (the expert
groups' over their EP group) and clips with it. At ZeRO-0 the engine computes it itself at each optimizer step
(:func:`autosp.compiler.experts.global_grad_norm`; DeepSpeed keeps none in fp32) and, with expert parallelism,
also clips with it in DeepSpeed's place: DeepSpeed 0.19.8 clips ZeRO-0 with the mean of the ranks' own norms
(fp32, ``runtime.utils.clip_grad_norm_``: each rank's norm holds only its own experts) or with the non-expert
parameters' norm alone (bf16, ``FP16_UnfusedOptimizer``). :attr:`SPEngine.grad_norm` is the step's norm.

ZeRO-3. DeepSpeed's ZeRO-3 gathers parameters in module hooks that are ``torch.compiler.disable``d, so
Dynamo breaks the graph around every module that owns parameters. The engine (1) marks the repeated
blocks (the children of every ``nn.ModuleList``: the decoder layers) as ZeRO-3 leaf modules, so each
layer is gathered at once and traced as one graph with its attention inside, (2) compiles without
``fullgraph`` and tells the passes to expect fragments: a mask that arrives as a graph input is verified
numerically on the example inputs, the loss pass runs wherever the loss is, and (3) passes global
``position_ids`` itself (when the model's forward accepts them), because positions derived from an
arange would cross a graph break before reaching the rotary embedding.
"""

from __future__ import annotations

import contextlib
import inspect
import re

import torch
import torch.nn.functional as F

from autosp.compiler import ops
from autosp.compiler.attention.documents import publish
from autosp.compiler.context import SPContext, unique_key
from autosp.compiler.inputs import LocalBatch, shard_batch
from autosp.errors import AutospError, UsageError

_ORIGINAL_SDPA = F.scaled_dot_product_attention


def _guarded_sdpa(*args, **kwargs):
    if not torch.compiler.is_compiling():
        raise UsageError("scaled_dot_product_attention ran outside the compiled sequence-parallel graph (a graph "
                         "break or recompile-limit fallback around attention), so it would attend over the local "
                         "shard only; see the Dynamo warnings above for the cause")
    return _ORIGINAL_SDPA(*args, **kwargs)


@contextlib.contextmanager
def sdpa_guard():
    F.scaled_dot_product_attention = _guarded_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _ORIGINAL_SDPA


def _graph_break_message(err: Exception) -> str:
    """One line: where in the user's code Dynamo had to stop, and why."""
    lines = [line.rstrip() for line in str(err).splitlines()]
    text = [line.strip() for line in lines if line.strip()]
    reason = text[0] if text else type(err).__name__
    for line in text:
        if line.startswith("Explanation:"):
            reason = f"{reason} ({line[len('Explanation:'):].strip()})"
            break
    location = ""
    stack = getattr(err, "real_stack", None)
    if stack:
        frame = stack[-1]
        location = f" at {frame.filename}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"
    else:  # the user frames are in the message: 'File "x.py", line N, in f' then the code
        for i in range(len(lines) - 1, -1, -1):
            match = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', lines[i])
            if match and "site-packages/torch/" not in match.group(1):
                code = lines[i + 1].strip() if i + 1 < len(lines) else ""
                location = f" at {match.group(1)}:{match.group(2)} ({match.group(3)}): {code}"
                break
    return (f"graph break in the model{location}: {reason}; autosp needs the whole model in one graph at "
            f"ZeRO 0-2 (ZeRO-3 allows breaks between modules)")


def _unwrap_compile_error(err: Exception):
    inner = getattr(err, "inner_exception", None) or err.__cause__
    while inner is not None and not isinstance(inner, AutospError):
        inner = getattr(inner, "inner_exception", None) or inner.__cause__
    return inner


def _extract_loss(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        loss = out[0]
    if not isinstance(loss, torch.Tensor):
        raise UsageError("the model returned no loss; it must compute the loss from labels in forward()")
    return loss


def _take_over_clipping(ds_engine) -> float:
    """Turn DeepSpeed's ZeRO-0 clipping off (it clips with the wrong norm under expert parallelism: see the
    module doc) and return its threshold, which the engine then clips to itself."""
    clip = float(ds_engine.gradient_clipping() or 0.0)
    ds_engine._config.gradient_clipping = 0.0  # fp32: _take_model_step clips when it is > 0
    if hasattr(ds_engine.optimizer, "clip_grad"):
        ds_engine.optimizer.clip_grad = 0.0  # bf16: FP16_UnfusedOptimizer clips in its own step
    return clip


class SPEngine:
    """A DeepSpeed engine running the sequence-parallel graph. Build it with :func:`autosp.compile`."""

    def __init__(self, ds_engine, layout, ctx: SPContext, candidate, *, ignore_index: int, pad_token_id: int,
                 pad_to_multiple_of: int, dtype: str, backend: str):
        self.ds_engine = ds_engine
        self.layout = layout
        self.ctx = ctx
        self.candidate = candidate
        self.ignore_index = ignore_index
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.dtype = dtype
        self.backend = backend
        # every call carries dp x micro_batch sequences (False: any multiple of dp, e.g. the Hugging Face
        # trainers' last, shorter batch of an epoch)
        self.fixed_batch = True
        inner = ds_engine.module
        inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # a PEFT model's own model
        params = inspect.signature(inner.forward).parameters
        self._accepts_position_ids = "position_ids" in params
        self._accepts_use_cache = "use_cache" in params
        self._accepts_attention_mask = "attention_mask" in params
        # what every forward must run around attention (ops.CALLS keys; every all-to-all, blocking or
        # started, counts as "all_to_all"): all-to-alls unless the SP group is all ring, ring attention
        # when there is a ring
        all_to_all = [("all_to_all", "all-to-all")] if candidate.ulysses > 1 or candidate.ring == 1 else []
        self._attention_collectives = all_to_all + ([("ring_attention", "ring attention")] if candidate.ring > 1
                                                    else [])
        self._zero0_norm = None
        self._clip = _take_over_clipping(ds_engine) if candidate.zero_stage == 0 and candidate.ep > 1 else 0.0

    # -- accessors --------------------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self.ds_engine.module

    @property
    def optimizer(self):
        return self.ds_engine.optimizer

    @property
    def device(self) -> torch.device:
        return torch.device(self.ds_engine.device)

    @property
    def sp_rank(self) -> int:
        return self.layout.sp_rank

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def stats(self):
        return self.ctx.stats

    def train(self, mode: bool = True):
        self.ds_engine.train(mode)
        return self

    # -- one step ---------------------------------------------------------------------------------
    def shard(self, input_ids, labels, attention_mask=None, position_ids=None, seq_lens=None,
              cu_seq_lens=None) -> LocalBatch:
        """This rank's inputs for a full batch (what ``__call__`` feeds the compiled model)."""
        make_positions = self.ctx.fragments and position_ids is None
        if make_positions and not self._accepts_position_ids:
            make_positions = False  # the position pass reports it if positions cross a graph break
        c = self.candidate
        return shard_batch(input_ids, labels, sp=c.sp, sp_rank=self.layout.sp_rank, dp=c.dp,
                           dp_rank=self.layout.dp_rank, attention_mask=attention_mask, position_ids=position_ids,
                           ignore_index=self.ignore_index, pad_token_id=self.pad_token_id,
                           pad_to_multiple_of=self.pad_to_multiple_of,
                           micro_batch=self.candidate.micro_batch if self.fixed_batch else None,
                           make_position_ids=make_positions, device=self.device, ring=c.ring,
                           chunks=self.ctx.candidate.sequence_chunks, seq_lens=seq_lens, cu_seq_lens=cu_seq_lens)

    def _documents(self, batch: LocalBatch) -> None:
        """Publish this call's packed documents for the attention ops (span mode), switching span mode on
        when the first call of an engine is packed."""
        if batch.documents is not None and not self.ctx.rule:
            if self.ctx.stats.graphs:
                raise UsageError("packed documents (position_ids restarting at 0, or seq_lens) reached an engine "
                                 "whose graphs were compiled for one sequence per row; pass "
                                 "options=autosp.CompileOptions(packed=True) (or make the first batch packed)")
            self.ctx.rule = unique_key("engine")
        if self.ctx.rule:
            publish(self.ctx.rule, batch.documents)

    def __call__(self, input_ids=None, labels=None, attention_mask=None, position_ids=None, seq_lens=None,
                 cu_seq_lens=None, **kwargs) -> torch.Tensor:
        if input_ids is None or labels is None:
            raise UsageError("the engine trains: pass input_ids and labels (the full batch, on every rank)")
        if position_ids is not None and not self._accepts_position_ids:
            raise UsageError("position_ids were given but the model's forward does not accept them")
        if (seq_lens is not None or cu_seq_lens is not None) and not self._accepts_position_ids:
            raise UsageError("packed documents (seq_lens / cu_seq_lens) need a model whose forward accepts "
                             "position_ids (each document's positions restart at 0)")
        batch = self.shard(input_ids, labels, attention_mask, position_ids, seq_lens, cu_seq_lens)
        self._documents(batch)
        self.ctx.local_len, self.ctx.global_len = batch.local_len, batch.global_len
        self.ctx.positions_from_runtime = batch.position_ids is not None
        inputs = {"input_ids": batch.input_ids, "labels": batch.labels}
        if batch.position_ids is not None:
            inputs["position_ids"] = batch.position_ids
            if (len(batch.spans) > 1 or self.ctx.rule) and self._accepts_attention_mask:
                # A zigzag shard's positions jump once, packed documents' restart; without an attention_mask
                # Hugging Face reads a jump in position_ids as packed documents and builds a block-diagonal
                # mask. An all-ones padding mask says "one sequence per row": the mask is then the plain
                # causal (or sliding-window) one over the rank's rows (which are in increasing order),
                # verified and removed by the mask pass; the documents reach the attention ops instead.
                inputs["attention_mask"] = torch.ones_like(batch.input_ids)
        if self._accepts_use_cache and "use_cache" not in kwargs:
            inputs["use_cache"] = False
        before = dict(ops.CALLS)
        try:
            with sdpa_guard(), self._router_loss(batch):
                out = self.ds_engine(**inputs, **kwargs)
        except AutospError:
            raise
        except torch._dynamo.exc.BackendCompilerFailed as err:
            inner = _unwrap_compile_error(err)
            if inner is not None:
                raise inner.with_traceback(None) from None
            raise
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            raise UsageError(f"too many distinct sequence lengths ({torch._dynamo.config.recompile_limit} compiled "
                             f"graphs): pass options=autosp.CompileOptions(pad_to_multiple_of=...) so lengths fall "
                             f"into fewer buckets") from None
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as err:
            raise UsageError(_graph_break_message(err)) from None
        losses = ops.CALLS["all_reduce_sum"] - before.get("all_reduce_sum", 0)
        if losses != 1:
            raise UsageError(f"the compiled graph computed the global loss {losses} times in one forward (expected "
                             f"once): the loss ran outside the compiled graph or more than one loss was found")
        missing = [label for name, label in self._attention_collectives
                   if ops.CALLS[name] - before.get(name, 0) == 0]
        if missing:
            raise UsageError(f"no attention found: no {' and no '.join(missing)} ran in the forward; the model must "
                             "call torch.nn.functional.scaled_dot_product_attention (Hugging Face: "
                             "attn_implementation='sdpa')")
        return _extract_loss(out)

    @contextlib.contextmanager
    def _router_loss(self, batch: LocalBatch):
        """MoE: during the call the model's load-balancing loss is the global one (router_loss.py)."""
        if not self.ctx.router_key:
            yield
            return
        from autosp.compiler import router_loss

        router_loss.publish_real_tokens(self.ctx.router_key, batch.real)
        router_loss._ACTIVE.append(self.ctx)
        try:
            yield
        finally:
            router_loss._ACTIVE.remove(self.ctx)

    def backward(self, loss: torch.Tensor, **kwargs):
        return self.ds_engine.backward(loss, **kwargs)

    def step(self, **kwargs):
        if self.candidate.zero_stage == 0 and self.ds_engine.is_gradient_accumulation_boundary():
            self._zero0_norm = self._clip_zero0()
        return self.ds_engine.step(**kwargs)

    def _clip_zero0(self) -> float:
        """ZeRO-0, at an optimizer step (the gradients reduced by the backward): the global gradient norm,
        and the gradients clipped to ``self._clip`` with it as one process's ``clip_grad_norm_`` does."""
        from autosp.compiler.experts import global_grad_norm

        params = list(self.module.parameters())
        # a loss-scaled optimizer (bf16's unfused one) holds scaled gradients; the norm and the threshold are
        # the unscaled ones
        scale = float(getattr(getattr(self.optimizer, "loss_scale_config", None), "cur_scale", 1.0))
        norm = float(global_grad_norm(params)) / scale
        if self._clip > 0:
            coef = min(1.0, self._clip / (norm + 1e-6))
            if coef < 1.0:
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], coef)
        return norm

    @property
    def grad_norm(self) -> float | None:
        """The global gradient norm (before clipping) of the last optimizer step: one process's
        ``clip_grad_norm_`` value (see the module doc); None before the first step or where DeepSpeed keeps
        none (ZeRO 1/2 with ``compute_grad_norm`` off)."""
        if self.candidate.zero_stage == 0:
            return self._zero0_norm
        stored = self.ds_engine.get_global_grad_norm()
        return None if stored is None else float(stored)

    # -- checkpoints (autosp.compiler.training.checkpoint) ------------------------------------------
    def save_checkpoint(self, directory, client_state: dict | None = None) -> str:
        """Write the full training state (fp32 weights, optimizer, LR scheduler, step counters, RNG) to
        ``directory``, atomically, in a form any plan can load. Every rank calls it."""
        from autosp.compiler.training.checkpoint import save_engine_checkpoint

        return save_engine_checkpoint(self, directory, client_state)

    def load_checkpoint(self, directory, load_optimizer: bool = True) -> dict:
        """Load a checkpoint saved by :meth:`save_checkpoint` under this or any other plan; returns its
        metadata (``['client_state']``: what was passed when saving). Every rank calls it."""
        from autosp.compiler.training.checkpoint import load_engine_checkpoint

        return load_engine_checkpoint(self, directory, load_optimizer=load_optimizer)


__all__ = ["SPEngine", "sdpa_guard"]
