"""Run plan configurations for real: the compiled SP training step on N ranks, timed and measured.

:func:`measure_many` runs a list of :class:`RunConfig` (all with the same world size) in one group of
spawned ranks (gloo on CPU, one rank per GPU with nccl when CUDA is there), one after the other: for
each, build the model, ``autosp.compile`` it under DeepSpeed with the plan's DeepSpeed config (the bucket
sizes the cost model charges for), run ``warmup`` steps (the first compiles), then

1. a static census of the tensors alive at the start of a step (:func:`memory.static_census`);
2. one micro-step whose forward runs under saved-tensor hooks (what the compiled graph keeps for
   backward) and the allocation profiler (the dynamic peak, attributed block by block:
   :func:`memory.attributed_peak`; CUDA: ``max_memory_allocated``, not attributed);
3. one step for the resident-set high-water mark (CPU);
4. ``steps`` timed steps (barrier, step, per-rank wall time; the step time is the slowest rank's, the
   figure the median over steps), with the CPU time every other process took meanwhile
   (``/proc/stat`` minus the ranks' own CPU time: :func:`contention`).

and returns one dict per configuration (:func:`measure` runs one). Tensors alive *before* a
configuration's model is built are excluded from its census, so a row is not charged for what an
earlier row in the same processes left behind. A knob the compiler rejects ("not implemented yet")
gives ``status: "not_implemented"`` with the compiler's message; any other failure ``status: "error"``.
Rows stream back as they finish (``on_row``), and a ``deadline`` stops the run gracefully: what was
measured by then is returned, the rest is ``status: "not_run"``.

On a GPU (``device="cuda"``, the default when CUDA is available; nccl, one rank per GPU) the model is
created on the device, the census counts device tensors only, and the allocated peak is
``torch.cuda.max_memory_allocated`` over the measured step (after ``reset_peak_memory_stats``) minus
what was allocated before the row began; ``memory["cuda"]`` adds the allocator's reserved peak and the
device memory outside the allocator (CUDA context, NCCL). Between rows the ranks free everything
(``gc``, ``torch._dynamo.reset``, ``torch.cuda.empty_cache``). The CUDA path was written from reading
(``python -m studies.gpu_check`` is the script that runs it on a GPU); the CPU path is the tested one.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import statistics
import tempfile
import time
from dataclasses import asdict, field, make_dataclass

from autosp.contract.knobs import KNOBS
from autosp.contract.specs import (AcceleratorSpec, Candidate, HardwareSpec, ModelSpec, Workload,
                                      fingerprint_of, from_dict)

GIB = 1024 ** 3


class _Run:
    """What a RunConfig does (its fields are made from the knob table below)."""

    @property
    def world(self) -> int:
        return self.sp * self.dp

    def candidate(self) -> Candidate:
        # the knob fields carry Candidate's names (one to one: the knob table's rows); the row stays flat for the
        # studies' JSON
        return Candidate(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Candidate)})

    def workload(self) -> Workload:
        hist: dict[int, int] = {}
        for length in self.doc_lens:
            hist[length] = hist.get(length, 0) + 1
        return Workload(seq_len=self.seq_len, dtype=self.dtype, doc_lens=tuple(sorted(hist.items())),
                        compile_backend=self.backend)  # an untiled loss is priced as the backend runs it

    def packed_inputs(self, ids):
        """(labels, position_ids) of packed documents, the Hugging Face convention: positions restart at 0
        in every document and each document's first label is -100 (no target crosses a boundary)."""
        import torch

        if sum(self.doc_lens) != self.seq_len:
            raise ValueError(f"doc_lens sum to {sum(self.doc_lens)}, not seq_len {self.seq_len}")
        positions = torch.cat([torch.arange(length) for length in self.doc_lens]).expand(ids.shape[0], -1)
        labels = ids.clone()
        labels[:, positions[0] == 0] = -100
        return labels, positions.contiguous()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        values = dict(data)
        values["model"] = from_dict(ModelSpec, values["model"]) if isinstance(values["model"], dict) else values["model"]
        values["doc_lens"] = tuple(values.get("doc_lens", ()))
        return from_dict(cls, values)


RunConfig = make_dataclass(
    "RunConfig",
    [("model", ModelSpec), ("seq_len", int), ("sp", int)]
    # every other plan knob, with its default (autosp.contract.knobs)
    + [(k.name, k.kind, field(default=k.default)) for k in KNOBS if k.name != "sp"]
    + [("dtype", str, field(default="fp32")), ("warmup", int, field(default=2)), ("steps", int, field(default=5)),
       # "reference" (autosp.compiler.models.llama), "hf" (transformers Llama) or "hf-moe" (transformers Mixtral)
       ("backend", str, field(default="inductor")), ("impl", str, field(default="reference")),
       # intra-op threads per rank; None: cores // world (as autosp-calibrate)
       ("threads", "int | None", field(default=None)), ("label", str, field(default="")),
       # packed: the documents of each sequence, in order (they sum to seq_len); () unpacked. Predicted as the
       # stream of docs/cost_model.md, exact when the lengths are equal and divide seq_len
       ("doc_lens", tuple, field(default=())),
       # one more step under the profiler after the timed ones: its device time by kernel kind (measure/kernels.py)
       ("kernel_breakdown", bool, field(default=False))],
    bases=(_Run,), frozen=True)
RunConfig.__module__ = __name__  # found by pickle (the spawned ranks) like a class written out
RunConfig.__doc__ = """One configuration: the model, the sequence, every plan knob (the knob table's rows, flat), and
how long to measure."""


def placeholder_hardware(world: int) -> HardwareSpec:
    """A HardwareSpec for the plan object the compiler reads (it uses the candidate and the DeepSpeed
    settings, not the hardware figures)."""
    return HardwareSpec(name=f"harness-cpux{world}",
                        accelerator=AcceleratorSpec(name="cpu", peak_flops=1e11, memory_bytes=16 * GIB,
                                                    memory_bandwidth=1e10),
                        devices_per_node=world, intra_node_bandwidth=1e9, intra_node_latency=1e-4,
                        host_bandwidth=5e9, host_memory_bytes=16 * GIB, comm_efficiency=1.0)


def make_plan(cfg: RunConfig, hardware: HardwareSpec | None = None):
    """The Plan object ``autosp.compile`` runs (its DeepSpeed config is the planner's) and its estimate."""
    from autosp.cost_models import estimate
    from autosp.contract.plan import Plan

    hw = hardware or placeholder_hardware(cfg.world)
    cand = cfg.candidate()
    est = estimate(cfg.model, hw, cfg.workload(), cand)
    return Plan(model=cfg.model, hardware=hw, workload=cfg.workload(), candidate=cand, estimate=est,
                search={"strategy": "harness"})


# --- contention ------------------------------------------------------------------------------------

def _proc_stat():
    from autosp.profiling.calibration.contention import _proc_stat as read

    return read()


def contention(stat_before, stat_after, own_cpu_seconds: float, wall: float) -> dict:
    """Share of all cores' time used by processes other than the ranks while they were timed."""
    out = {"other_cpu_share": None, "steal_share": None, "own_cpu_share": None}
    if not stat_before or not stat_after:
        return out
    tick = os.sysconf("SC_CLK_TCK")
    busy = stat_after["busy"] - stat_before["busy"]
    total = busy + stat_after["idle"] - stat_before["idle"]
    if total <= 0:
        return out
    ours = own_cpu_seconds * tick
    out["other_cpu_share"] = max(0.0, (busy - ours) / total)
    out["steal_share"] = (stat_after["steal"] - stat_before["steal"]) / total
    out["own_cpu_share"] = min(1.0, ours / total)
    return out


# --- one configuration on this rank ------------------------------------------------------------------

def _build_model(cfg: RunConfig, device):
    """The model, created and initialised on ``device`` (a billion-parameter init on the host takes
    longer than a step, and the copy would need host memory for the fp32 weights)."""
    import torch

    torch.manual_seed(0)
    with torch.device(device):
        if cfg.impl == "hf":
            from transformers import LlamaConfig, LlamaForCausalLM

            m = cfg.model
            config = LlamaConfig(hidden_size=m.hidden, intermediate_size=m.ffn_hidden, num_attention_heads=m.n_heads,
                                 num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim, num_hidden_layers=m.n_layers,
                                 vocab_size=m.vocab, max_position_embeddings=max(cfg.seq_len, 2048),
                                 rope_theta=m.rope_theta, tie_word_embeddings=m.tied_embeddings, use_cache=False)
            return LlamaForCausalLM(config).to(torch.float32)
        if cfg.impl == "hf-moe":  # a mixture of experts: transformers' Mixtral with the spec's routed experts
            from transformers import MixtralConfig, MixtralForCausalLM

            m = cfg.model
            if not m.n_experts or m.shared_ffn_hidden or m.dense_layers:
                raise ValueError("impl 'hf-moe' builds a Mixtral: a spec with n_experts, no shared experts and no "
                                 "dense layers")
            config = MixtralConfig(hidden_size=m.hidden, intermediate_size=m.expert_ffn_hidden,
                                   num_local_experts=m.n_experts, num_experts_per_tok=m.experts_per_token,
                                   num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
                                   head_dim=m.head_dim, num_hidden_layers=m.n_layers, vocab_size=m.vocab,
                                   max_position_embeddings=max(cfg.seq_len, 2048), rope_theta=m.rope_theta,
                                   sliding_window=None, tie_word_embeddings=m.tied_embeddings, use_cache=False)
            return MixtralForCausalLM(config).to(torch.float32)
        from autosp.compiler.models.llama import Llama

        return Llama(cfg.model)


def _batch(cfg: RunConfig):
    """The row's fixed batch (every rank passes the full dp x micro_batch sequences): ids, labels and the extra
    engine inputs (packed documents' position_ids)."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, cfg.model.vocab, (cfg.dp * cfg.micro_batch, cfg.seq_len), generator=gen)
    labels = ids.clone()
    extra = {}
    if cfg.doc_lens:
        labels, extra["position_ids"] = cfg.packed_inputs(ids)
    return ids, labels, extra


def _timed_steps(step, steps: int, rank: int, cuda: bool, device) -> dict:
    """``steps`` optimizer steps, each between barriers: their seconds on this rank, this process's CPU
    seconds, the wall time, and the machine's CPU counters and load around them (for the contention note)."""
    import torch
    import torch.distributed as dist

    from studies.measure import memory

    rank_times, own = [], 0.0
    stat0 = _proc_stat() if rank == 0 else None
    load0 = os.getloadavg()[0]
    wall0 = time.perf_counter()
    for _ in range(steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        c0, ts = memory.cpu_seconds(), time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        rank_times.append(time.perf_counter() - ts)
        own += memory.cpu_seconds() - c0
    dist.barrier()
    wall = time.perf_counter() - wall0
    stat1 = _proc_stat() if rank == 0 else None
    load1 = os.getloadavg()[0]
    return {"step_times": rank_times, "own_cpu_seconds": own, "wall": wall, "stat": (stat0, stat1),
            "load1": (load0, load1)}


def _memory_entry(census: dict, dyn: dict, resident: dict, cuda: bool, leftover) -> dict:
    """A rank's memory figures: the static census, the attributed dynamic peak, the allocated peak and, on a
    CPU, the process's resident high-water mark."""
    if cuda:  # the allocator's own high-water mark of the measured step (it sees every device allocation)
        allocated_peak = dyn["cuda"]["max_allocated"] - leftover
    else:
        allocated_peak = census["total"] + dyn["peak"]
    mem = {"static": census, "saved": dyn["saved"], "dynamic_peak": dyn["peak"], "dynamic_end": dyn["end"],
           "dynamic_at_peak": dyn.get("at_peak"),
           "other_largest_blocks": dyn.get("other_largest_blocks"), "peak_at": dyn.get("peak_at_fraction_of_step"), "dynamic_method": dyn["method"], "allocated_peak": allocated_peak}
    if cuda:
        mem["cuda"] = {**dyn["cuda"], "leftover_before_row": leftover}
    if resident:
        mem["resident_hwm"] = resident["hwm"]
        mem["rss_step_start"] = resident["rss_start"]
        mem["heap_in_use_step_start"] = resident["heap_in_use_start"]
        if resident["hwm"] is not None:
            mem["runtime_overhead"] = resident["hwm"] - allocated_peak
    return mem


def _run_one(cfg: RunConfig, rank: int, world: int, device, hardware) -> dict:
    import torch

    import autosp
    from studies.measure import kernels, memory

    cuda = device.type == "cuda"
    leftover = None
    if cuda:  # what an earlier row left allocated (normally ~0) is not this row's
        torch.cuda.synchronize(device)
        leftover = torch.cuda.memory_allocated(device)
    before_keys = memory.live_storage_keys()
    plan = make_plan(cfg, hardware)
    model = _build_model(cfg, device)
    t0 = time.perf_counter()
    engine = autosp.compile(model, plan, options=autosp.CompileOptions(backend=cfg.backend, dtype=cfg.dtype))
    del model
    ids, labels, extra = _batch(cfg)

    def micro(hooks=None):
        if hooks is None:
            loss = engine(input_ids=ids, labels=labels, **extra)
        else:
            with hooks:
                loss = engine(input_ids=ids, labels=labels, **extra)
        engine.backward(loss)
        engine.step()
        return loss

    def step():
        for _ in range(cfg.grad_accum):
            micro()

    compile_times = []
    for i in range(max(1, cfg.warmup)):
        ts = time.perf_counter()
        step()
        compile_times.append(time.perf_counter() - ts)
    setup_seconds = time.perf_counter() - t0

    census = memory.static_census(engine.module, engine.optimizer, device)
    # exclude what existed before this configuration (earlier rows' leftovers, the generator state, ...)
    stale = sum(nbytes for key, nbytes in memory.live_storage_keys().items() if key in before_keys)
    census["other"] = max(0, census["other"] - stale)
    census["total"] = max(0, census["total"] - stale)

    def forward():
        return engine(input_ids=ids, labels=labels, **extra)

    dyn = memory.attributed_peak(forward, engine.backward, engine.step, engine.module, engine.optimizer,
                                 cfg.model.vocab, device, memory.zero_bucket_bytes(cfg.model.n_params()))
    for _ in range(cfg.grad_accum - 1):
        micro()
    gc.collect()
    resident = memory.resident_peak(step) if not cuda else {}
    timed = _timed_steps(step, cfg.steps, rank, cuda, device)
    breakdown = kernels.breakdown(step, device) if cfg.kernel_breakdown else None
    per_rank = {"rank": rank, "memory": _memory_entry(census, dyn, resident, cuda, leftover),
                "step_times": timed["step_times"], "own_cpu_seconds": timed["own_cpu_seconds"],
                "wall": timed["wall"], "stat": timed["stat"], "load1": timed["load1"], "compile_times": compile_times,
                "setup_seconds": setup_seconds,
                "device_name": torch.cuda.get_device_name(device) if cuda else "cpu"}
    if breakdown is not None:
        per_rank["kernels"] = breakdown
    del engine
    return per_rank


def _combine(cfg: RunConfig, ranks: list[dict], prediction=None) -> dict:
    """One row: the slowest rank's step time per step (median over steps) and the rank with the largest
    allocated peak's memory."""
    steps = [max(r["step_times"][i] for r in ranks) for i in range(len(ranks[0]["step_times"]))]
    own = sum(r["own_cpu_seconds"] for r in ranks)
    stat0, stat1 = ranks[0]["stat"]
    cont = contention(stat0, stat1, own, ranks[0]["wall"])
    cont["load1_before"], cont["load1_after"] = ranks[0]["load1"]
    worst = max(ranks, key=lambda r: r["memory"]["allocated_peak"])
    row = {"status": "ok", "config": cfg.to_dict(), "label": cfg.label,
           "time": {"step_median": statistics.median(steps), "step_min": min(steps), "step_max": max(steps),
                    "steps": steps, "spread": (max(steps) - min(steps)) / statistics.median(steps),
                    "first_step": max(r["compile_times"][0] for r in ranks),
                    "setup_seconds": max(r["setup_seconds"] for r in ranks)},
           "memory": worst["memory"], "memory_rank": worst["rank"],
           "memory_per_rank": [r["memory"]["allocated_peak"] for r in ranks],
           "contention": cont}
    if "kernels" in ranks[0]:
        row["kernels"] = ranks[0]["kernels"]
    if prediction is not None:
        row["prediction"] = prediction
    return row


# --- process group -----------------------------------------------------------------------------------

def _row_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"row-{index}.pt")


def _save_atomically(obj, path: str) -> None:
    import torch

    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # the parent polls for the file: it must never see half of it


def _failure(err: Exception) -> dict:
    from autosp.errors import UsageError

    text = str(err)
    if isinstance(err, UsageError):
        unbuilt = "not implemented" in text or "cannot compile" in text
        return {"status": "not_implemented" if unbuilt else "error", "error": text}
    return {"status": "error", "error": f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"}


def _rank_entry(rank, world, port, folder, configs, threads, device_kind, hardware, deadline=None,
                min_row_seconds=0.0, prepare=None):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        for index, cfg in enumerate(configs):
            go = [deadline is None or time.time() + min_row_seconds <= deadline]
            dist.broadcast_object_list(go, src=0)  # every rank takes rank 0's decision
            if not go[0]:
                break
            try:
                if prepare is not None:
                    prepare(cfg)
                out = _run_one(cfg, rank, world, device, hardware)
            except Exception as err:  # noqa: BLE001 - a row fails, the study goes on
                out = _failure(err)
            gathered = [None] * world
            dist.all_gather_object(gathered, out)
            if rank == 0:
                _save_atomically(gathered, _row_path(folder, index))
            # free this row's model, engine, compiled graphs and cached blocks before the next one
            gc.collect()
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def default_threads(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)


def _predict(configs, hardware, predict: bool) -> list:
    predictions = []
    for cfg in configs:
        pred = None
        if hardware is not None and predict:
            from autosp.cost_models import estimate

            try:
                pred = _estimate_dict(estimate(cfg.model, hardware, cfg.workload(), cfg.candidate()))
            except ValueError as err:
                pred = {"invalid": str(err)}
        predictions.append(pred)
    return predictions


def _make_row(cfg: RunConfig, ranks: list, pred, env: dict) -> dict:
    bad = next((r for r in ranks if r.get("status") in ("error", "not_implemented")), None)
    if bad is not None:
        row = {"status": bad["status"], "error": bad["error"], "config": cfg.to_dict(), "label": cfg.label}
        if pred is not None:
            row["prediction"] = pred
    else:
        row = _combine(cfg, ranks, pred)
        env = {**env, "device_name": ranks[0].get("device_name")}
    row["env"] = env
    return row


def _stop(processes) -> None:
    """Stop the ranks this call started (each by its own process handle)."""
    for proc in processes:
        if proc.is_alive():
            proc.kill()
    for proc in processes:
        proc.join(timeout=30)


def measure_many(configs: list[RunConfig], hardware: HardwareSpec | None = None, device: str | None = None,
                 predict: bool = True, *, on_row=None, deadline: float | None = None, min_row_seconds: float = 0.0,
                 prepare=None) -> list[dict]:
    """Run ``configs`` (same world size) in one group of spawned ranks; one result dict per config.

    ``hardware``: the HardwareSpec the prediction (``row["prediction"]``, an Estimate as a dict) and the
    plan use; None: no prediction and a placeholder for the plan.

    ``on_row(index, row)`` is called here as each configuration's row arrives, while the later ones run.
    ``deadline`` (a ``time.time()`` value): no configuration starts with fewer than ``min_row_seconds``
    left, and ranks still running at the deadline are stopped; configurations not measured get
    ``status: "not_run"``. ``prepare(cfg)`` runs on every rank before a configuration is built (a
    picklable function; an exception from it fails that row with its message).
    """
    import torch
    import torch.multiprocessing as mp

    from autosp.compiler.testing import free_port

    if not configs:
        return []
    world = configs[0].world
    if any(c.world != world for c in configs):
        raise ValueError("measure_many: every configuration must have the same world size (sp x dp)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = configs[0].threads or default_threads(world)
    predictions = _predict(configs, hardware, predict)
    env = {"device": device, "world": world, "threads_per_rank": threads, "torch": torch.__version__,
           "cores": os.cpu_count()}
    rows: list = [None] * len(configs)
    stopped_at_deadline = False
    saved_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            context = mp.start_processes(_rank_entry, args=(world, free_port(), tmp, list(configs), threads, device,
                                                            hardware, deadline, min_row_seconds, prepare),
                                         nprocs=world, join=False, start_method="spawn")
            try:
                finished = False
                while not finished:
                    finished = context.join(timeout=0.5)  # raises if a rank failed
                    for i, cfg in enumerate(configs):
                        if rows[i] is None and os.path.exists(_row_path(tmp, i)):
                            ranks = torch.load(_row_path(tmp, i), weights_only=False)
                            rows[i] = _make_row(cfg, ranks, predictions[i], env)
                            if on_row is not None:
                                on_row(i, rows[i])
                    if not finished and deadline is not None and time.time() > deadline:
                        stopped_at_deadline = True
                        break
            finally:
                _stop(context.processes)
    finally:
        if saved_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved_threads
    first_missing = True
    for i, cfg in enumerate(configs):
        if rows[i] is None:
            if stopped_at_deadline and first_missing:
                why = "stopped at the deadline while it ran"
            else:
                why = f"not started: fewer than {min_row_seconds:.0f} s left before the deadline"
            first_missing = False
            rows[i] = {"status": "not_run", "error": why, "config": cfg.to_dict(), "label": cfg.label, "env": env}
            if predictions[i] is not None:
                rows[i]["prediction"] = predictions[i]
    return rows


def measure(cfg: RunConfig, hardware: HardwareSpec | None = None, device: str | None = None) -> dict:
    """Run one configuration; see :func:`measure_many`."""
    return measure_many([cfg], hardware, device)[0]


def _estimate_dict(est) -> dict:
    data = dataclasses.asdict(est)
    data["memory"]["total"] = est.memory.total
    data["fits"] = est.fits
    return data
