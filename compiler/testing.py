"""Check an SP engine against one process on the full sequence (tests and studies use this).

- :func:`spawn` runs ``fn(rank, world, *args)`` on ``world`` CPU processes joined by gloo on a free port
  (one thread each), and returns rank 0's return value. The processes are forked from a forkserver that
  imported torch, DeepSpeed and transformers once (:func:`start`), not started bare: each bare start spent
  ~7.5 CPU-s importing them again, a sizeable share of the test suite on two cores.
- :func:`reference_run` trains a copy of the model in this process on the full batches;
  :func:`sp_run` trains through ``autosp.compile``; both record the loss of every step, the gradients
  of the first step and the weights after the last, by parameter name.
- :func:`compare` gives the norm-based relative error of each of them.
"""

from __future__ import annotations

import atexit
import copy
import multiprocessing
import multiprocessing.forkserver
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What a spawned rank needs, imported once in the forkserver (its children are forked from it with these
# modules loaded) instead of in every rank. None of them starts a thread on import (checked: one thread after
# importing all of them), so forking after them is safe; OMP_NUM_THREADS=1 is set before the server starts.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch._functorch.aot_autograd", "deepspeed",
           "deepspeed.runtime.engine", "transformers", "transformers.models.llama.modeling_llama",
           "autosp.compiler.api", "autosp.compiler.testing"]


def _stop_forkserver():
    """Stop this process's forkserver and reap it at exit (Python leaves it to notice on its own), so its
    CPU time and its children's count towards this process's, as they did with bare starts."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


def start(entry, args, nprocs: int, join: bool = True):
    """``torch.multiprocessing.start_processes`` of ``entry(i, *args)`` from the forkserver that preloads
    :data:`PRELOAD` (started on first use, once per process). The server keeps the environment it was
    started with: an entry that needs the caller's current environment takes it as an argument (``_entry``
    does). Returns the ProcessContext (``join=False``) or None."""
    os.environ["OMP_NUM_THREADS"] = "1"  # the server (and so every rank) starts single-threaded
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    if not getattr(start, "_registered", False):
        atexit.register(_stop_forkserver)
        start._registered = True
    return mp.start_processes(entry, args=args, nprocs=nprocs, join=join, start_method="forkserver")


def _entry(rank, world, port, out_path, env, fn, args):
    os.environ.clear()
    os.environ.update(env)  # the caller's environment at spawn time, not the forkserver's
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args):
    """Run ``fn(rank, world, *args)`` on ``world`` processes; return what rank 0 returned."""
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.pt")
        start(_entry, (world, free_port(), out_path, dict(os.environ), fn, args), world)
        return torch.load(out_path, weights_only=False)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (absolute error when b is zero)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff


def _loss(out):
    return out if isinstance(out, torch.Tensor) else (out.loss if hasattr(out, "loss") else out[0])


def packed_loss(model, batch, ignore_index: int = -100) -> torch.Tensor:
    """The loss of a packed batch computed the slow, obviously right way: every document of every row run
    through ``model`` on its own (positions from 0, no neighbours), each document's mean loss weighted by
    its number of targets, summed and divided by the batch's targets. Documents come from the batch's
    ``position_ids``, ``seq_lens`` or ``cu_seq_lens`` (:mod:`autosp.compiler.attention.documents`)."""
    from autosp.compiler.inputs import shard_batch

    ids, labels = batch["input_ids"], batch["labels"]
    docs = shard_batch(ids, labels, sp=1, sp_rank=0, dp=1, dp_rank=0, position_ids=batch.get("position_ids"),
                       seq_lens=batch.get("seq_lens"), cu_seq_lens=batch.get("cu_seq_lens")).documents
    total, count = None, 0
    for row in range(ids.shape[0]):
        for a, b in (docs[row] if docs is not None else [(0, ids.shape[1])]):
            targets = int((labels[row, a + 1:b] != ignore_index).sum())
            if targets == 0:  # a document without targets adds nothing (and its mean would be 0 / 0)
                continue
            term = _loss(model(input_ids=ids[row:row + 1, a:b], labels=labels[row:row + 1, a:b])) * targets
            total = term if total is None else total + term
            count += targets
    return total / count


def reference_run(model, batches, optimizer_fn, model_kwargs=None, grad_accum: int = 1,
                  gradient_clipping: float | None = None, loss_fn=None) -> dict:
    """One process, full sequences: losses per micro-step, grads of the first optimizer step (the mean over
    its ``grad_accum`` micro-batches, as DeepSpeed accumulates; before clipping), weights after the last
    step. Gradients are clipped to the global norm ``gradient_clipping`` before each step, as DeepSpeed
    does with the config ``autosp.compile`` builds (None: its default, 0: no clipping). ``loss_fn(model,
    batch)``: how to get a batch's loss (default: the model's own; :func:`packed_loss` for packed batches)."""
    from autosp.contract.deepspeed_config import GRADIENT_CLIPPING

    clip = GRADIENT_CLIPPING if gradient_clipping is None else gradient_clipping
    model = copy.deepcopy(model)
    model.train()
    optimizer = optimizer_fn(model.parameters())
    losses, grads, grad_norm = [], None, None
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        loss = loss_fn(model, batch) if loss_fn is not None else _loss(model(**batch, **(model_kwargs or {})))
        (loss / grad_accum).backward()
        losses.append(loss.item())
        if (i + 1) % grad_accum == 0:
            if grads is None:
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
                grad_norm = torch.nn.utils.get_total_norm(list(grads.values())).item()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "weights": weights, "grad_norm": grad_norm, "clip": clip}


def _all_experts(param, value):
    """An expert-parallel parameter's tensor for every expert: this rank's experts gathered over its EP group
    (:mod:`autosp.compiler.experts`), in expert order; other parameters unchanged."""
    group = getattr(param, "autosp_expert_group", "")
    if not group or value is None:
        return value
    from autosp.compiler.ops import _group

    pg = _group(group)
    parts = [torch.empty_like(value) for _ in range(dist.get_world_size(group=pg))]
    dist.all_gather(parts, value.contiguous(), group=pg)
    return torch.cat(parts)


def full_grad(param):
    from deepspeed.utils import safe_get_full_grad

    grad = _all_experts(param, safe_get_full_grad(param))
    return None if grad is None else grad.detach().float().cpu().clone()


def full_weight(param):
    from deepspeed.utils import safe_get_full_fp32_param

    value = safe_get_full_fp32_param(param)
    if value is None:
        value = param.detach()
    return _all_experts(param, value.detach().float()).cpu().clone()


def sp_run(model, batches, optimizer_fn, plan=None, *, sp_size=None, **option_fields) -> dict:
    """The same training through ``autosp.compile(model, plan, sp_size=...)`` with
    ``CompileOptions(optimizer=optimizer_fn, **option_fields)``; every rank gets the full batches. Gradients are
    read at the first gradient-accumulation boundary, after DeepSpeed reduced them; ``grad_norm`` is the engine's
    global gradient norm of that optimizer step (before clipping)."""
    from autosp.compiler.api import compile_model
    from autosp.compiler.options import CompileOptions

    options = CompileOptions(optimizer=optimizer_fn, **option_fields)
    engine = compile_model(copy.deepcopy(model), plan, sp_size=sp_size, options=options)
    losses, grads, grad_norm = [], None, None
    for batch in batches:
        loss = engine(**batch)
        engine.backward(loss)
        losses.append(loss.item())
        first = grads is None and engine.ds_engine.is_gradient_accumulation_boundary()
        if first:
            grads = {n: full_grad(p) for n, p in engine.module.named_parameters()}
        engine.step()
        if first:
            grad_norm = engine.grad_norm
    weights = {n: full_weight(p) for n, p in engine.module.named_parameters()}
    return {"losses": losses, "grads": grads, "weights": weights, "stats": engine.stats, "grad_norm": grad_norm}


def compare(sp: dict, ref: dict) -> dict:
    """Worst relative errors: {'loss': .., 'grad': (err, name), 'weight': (err, name)}."""
    out = {"loss": max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(sp["losses"], ref["losses"]))}
    for key, ref_key in (("grad", "grads"), ("weight", "weights")):
        worst = (0.0, None)
        for name, expected in ref[ref_key].items():
            got = sp[ref_key].get(name)
            if got is None:
                return {**out, key: (float("inf"), name + " missing")}
            err = rel_err(got, expected)
            worst = max(worst, (err, name), key=lambda t: t[0])
        out[key] = worst
    return out


def assert_within(result: dict, tol) -> dict:
    """Assert that a spawned case ran (no ``crash``) and that its worst loss, gradient and weight errors
    (:func:`compare`) are within ``tol``: one bound for all three, or a dict with ``loss``, ``grad``, ``weight``.
    Returns ``result`` for the case's own further checks."""
    assert "crash" not in result, result.get("crash")
    bound = tol if isinstance(tol, dict) else {"loss": tol, "grad": tol, "weight": tol}
    errors = result["errors"]
    assert errors["loss"] <= bound["loss"], errors
    assert errors["grad"][0] <= bound["grad"], errors
    assert errors["weight"][0] <= bound["weight"], errors
    return result


def run_cases(rank: int, names, run_one) -> dict:
    """``{name: run_one(name)}`` for every case, each on a fresh Dynamo; a case that raises is recorded as
    ``{"crash": traceback}`` so one broken case does not hide the others. Rank 0 adds ``seconds``."""
    import time
    import traceback

    import torch._dynamo

    results = {}
    for name in names:
        start = time.perf_counter()
        torch._dynamo.reset()
        try:
            results[name] = run_one(name) or {}
        except Exception:  # noqa: BLE001 - recorded and reported by the test
            results[name] = {"crash": traceback.format_exc()}
        if rank == 0:
            results[name]["seconds"] = time.perf_counter() - start
            print(f"[case] {name}: {results[name]['seconds']:.1f} s", flush=True)
    return results


def capture_graph(fn, *args, **kwargs):
    """The Dynamo FX graph of ``fn(*args, **kwargs)`` and its example inputs (what a backend receives),
    for unit tests of the passes."""
    import torch._dynamo

    box = {}

    def backend(gm, example_inputs):
        box["gm"], box["inputs"] = gm, example_inputs
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args, **kwargs)
    return box["gm"], box["inputs"]


__all__ = ["alive", "assert_within", "capture_graph", "child_pids", "compare", "free_port", "full_grad", "full_weight", "packed_loss",
           "reference_run", "rel_err", "run_cases", "sp_run", "spawn", "start"]


def _proc_state(pid: int):
    """(state letter, parent pid) of a Linux process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def child_pids(pid: int) -> list:
    """Live (not zombie) processes whose parent is ``pid`` (Linux: reads /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = _proc_state(int(entry))
            if state is not None and state[1] == pid and state[0] != "Z":
                out.append(int(entry))
    return out


def alive(pids) -> list:
    """The processes of ``pids`` still running (a zombie has ended)."""
    return [pid for pid in pids if (state := _proc_state(pid)) is not None and state[0] != "Z"]

