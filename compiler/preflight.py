"""What ``autosp-train`` checks before it builds a model, starts a process group or reads a batch.

Building an 8B model takes a minute and tens of GiB on every process; a plan launched on the wrong number
of processes, a model whose heads do not divide over the SP degree, a token file of floats or a log path
that cannot be written must fail *before* that, in a second, with one line. Every function here raises
:class:`~autosp.errors.UsageError` (bad input, exit 2) or :class:`~autosp.errors.InfeasibleError` (it
cannot fit on this machine, exit 3). Only :func:`hf_model_class` imports transformers (and with it torch).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from autosp.errors import InfeasibleError, UsageError
from autosp.messages import install_hint

__all__ = ["MAX_NODES", "Launch", "ModelFacts", "check_host_memory", "check_numbers", "check_parallel", "hf_model_class",
           "launch_from_env", "model_facts", "open_tokens"]

OVERRIDES = (("n_layers", "--layers"), ("hidden", "--hidden"), ("n_heads", "--heads"), ("n_kv_heads", "--kv-heads"),
             ("ffn_hidden", "--ffn"), ("vocab", "--vocab"))
TOKEN_SUFFIXES = (".npy", ".pt", ".bin")
FP32_BYTES = 4
INT64_BYTES = 8


@dataclass(frozen=True)
class Launch:
    """The processes of this run: from torchrun / the deepspeed launcher (``RANK`` ... in the
    environment), from ``--nproc-per-node`` (autosp-train starts them, on this node of ``--nnodes``), or this
    process alone."""

    world: int
    rank: int = 0
    local_world: int = 1
    launcher: str = "none"  # "env" (torchrun, deepspeed), "spawn" (--nproc-per-node / --nnodes), "none"
    nodes: object = None  # a NodeGroup (autosp.compiler.multinode) when autosp-train starts one node of several

    @property
    def nnodes(self) -> int:
        return self.world // self.local_world

    def shape(self) -> str:
        """How the launch was asked for, in its flags: ``--nnodes 2 x --nproc-per-node 4``."""
        if self.nnodes > 1:
            return f"--nnodes {self.nnodes} x --nproc-per-node {self.local_world}"
        return f"--nproc-per-node {self.local_world}"


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"the launcher set no {name}")
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"the launcher set {name}={value!r}, not an integer") from None


MAX_NODES = 65_536
MAX_PROCS_PER_NODE = 1024


def _check_range(value, low: int, high: int, flag: str) -> None:
    if value is not None and not low <= value <= high:
        raise UsageError(f"{flag} must be between {low} and {high:,}, got {value}")


def _node_group(nproc: int, nnodes: int | None, node_rank: int | None, master_addr: str | None,
                master_port: int | None, timeout_s: int | None):
    """This node's NodeGroup for ``--nnodes K`` > 1 (None for one node), its flags checked."""
    from autosp.compiler import multinode

    nnodes = nnodes or 1
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank} is out of range for --nnodes {nnodes}: number the nodes 0.."
                         f"{nnodes - 1} (0 is the node at --master-addr)")
    _check_range(master_port, 1, 65_535, "--master-port")
    _check_range(timeout_s, 1, 86_400, "--rdzv-timeout")
    if nnodes == 1:
        return None
    if node_rank is None or not master_addr or not master_addr.strip():
        missing = " and ".join(flag for flag, given in (("--node-rank R", node_rank is not None),
                                                        ("--master-addr HOST", master_addr and master_addr.strip()))
                               if not given)
        others = "1" if nnodes == 2 else f"1..{nnodes - 1}"
        raise UsageError(f"--nnodes {nnodes} needs {missing} on every node, as torchrun takes them (--node-rank 0 on "
                         f"the node at --master-addr, which every node must reach, {others} on the others)")
    return multinode.NodeGroup(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr.strip(),
                               master_port=master_port or multinode.DEFAULT_PORT,
                               timeout_s=timeout_s or multinode.DEFAULT_TIMEOUT_S)


def launch_from_env(nproc_per_node: int | None, nnodes: int | None = None, node_rank: int | None = None,
                    master_addr: str | None = None, master_port: int | None = None,
                    rdzv_timeout: int | None = None) -> Launch:
    """The launch: torchrun's or the deepspeed launcher's environment, else the flags (``--nproc-per-node N``,
    with ``--nnodes K --node-rank R --master-addr HOST --master-port P`` for one node of several)."""
    _check_range(nproc_per_node, 1, MAX_PROCS_PER_NODE, "--nproc-per-node")
    _check_range(nnodes, 1, MAX_NODES, "--nnodes")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = _env_int("WORLD_SIZE")
        local = _env_int("LOCAL_WORLD_SIZE", _env_int("LOCAL_SIZE", world))  # torchrun's name, deepspeed's
        rank = _env_int("RANK")
        if nproc_per_node is not None and nproc_per_node != local:
            raise UsageError(f"--nproc-per-node {nproc_per_node} disagrees with the launcher's {local} processes per "
                             "node; drop --nproc-per-node when torchrun or deepspeed starts the processes")
        if (nnodes is not None and nnodes * local != world) or (node_rank is not None and node_rank != rank // local):
            raise UsageError(f"--nnodes/--node-rank disagree with the launcher's {world} processes, {local} per node "
                             f"(this is rank {rank}); drop them when torchrun or deepspeed starts the processes")
        return Launch(world=world, rank=rank, local_world=local, launcher="env")
    nodes = _node_group(nproc_per_node or 1, nnodes, node_rank, master_addr, master_port, rdzv_timeout)
    if nodes is not None:
        local = nproc_per_node or 1  # torchrun's default too
        return Launch(world=nodes.nnodes * local, rank=nodes.node_rank * local, local_world=local, launcher="spawn",
                      nodes=nodes)
    if nproc_per_node is not None:
        return Launch(world=nproc_per_node, local_world=nproc_per_node, launcher="spawn")
    return Launch(world=1)


def check_numbers(args) -> None:
    """Flags whose values no run can use."""
    from autosp.units import check_seed

    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise UsageError(f"--lr must be a positive finite number, got {args.lr!r}")
    check_seed(args.seed, "--seed")
    for field, flag in OVERRIDES + (("sp", "--sp"), ("micro_batch", "--micro-batch"), ("grad_accum", "--grad-accum")):
        value = getattr(args, field, None)
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")


@dataclass(frozen=True)
class ModelFacts:
    """What the checks need to know about the model, read without building it."""

    spec: object  # ModelSpec (the preset's, the plan's or the config's), overrides applied
    hf_config: dict | None  # the config.json's contents for a Hugging Face model, else None
    hf_path: str | None
    description: str


def _hf_path(model_arg: str | None) -> str | None:
    if model_arg and (os.path.sep in model_arg or model_arg.endswith(".json") or os.path.isdir(model_arg)):
        return model_arg
    return None


def _planned_config(source: str) -> str | None:
    """The config.json a plan's model was made from: its ``source`` is the absolute path, or, for a model priced
    from its traced graph, ``graph profile <fingerprint> of <path>``."""
    if source.startswith("graph profile ") and " of " in source:
        source = source.split(" of ", 1)[1]
    if os.path.isabs(source) and os.path.isdir(source):
        source = os.path.join(source, "config.json")
    return source if os.path.isabs(source) and source.endswith(".json") else None


def model_facts(args, plan) -> ModelFacts:
    """The model's shape from a preset, the plan or a config.json, with ``--layers ...`` applied."""
    from autosp.cost_models.catalog.models import model_from_hf_config, resolve_model

    hf_path = _hf_path(args.model)
    config = None
    if hf_path is not None:
        spec = model_from_hf_config(hf_path)  # one-line errors for a missing, binary or malformed config
        from autosp.files import read_json

        path = os.path.join(hf_path, "config.json") if os.path.isdir(hf_path) else hf_path
        config = read_json(path, "model config ", allow_bom=False)
    elif args.model:
        spec = resolve_model(args.model)
    elif plan is not None:
        spec = plan.model
        source = _planned_config(getattr(spec, "source", "") or "")
        if source is not None:  # planned from a config.json: train THAT model
            if not os.path.isfile(source):
                raise UsageError(f"the plan was made from the model config {source}, which no longer exists; pass "
                                 "--model PATH/config.json (the same model)")
            from autosp.files import read_json

            hf_path, config = source, read_json(source, "model config ", allow_bom=False)
    else:
        raise UsageError("say what to train: --model PRESET or CONFIG.json, or --plan")
    changes = {field: getattr(args, field) for field, _ in OVERRIDES if getattr(args, field) is not None}
    if "hidden" in changes or "n_heads" in changes:
        hidden, heads = changes.get("hidden", spec.hidden), changes.get("n_heads", spec.n_heads)
        if hidden % heads:
            raise UsageError(f"--hidden {hidden} is not a multiple of --heads {heads}")
        changes["head_dim"] = hidden // heads
    if "n_heads" in changes and "n_kv_heads" not in changes and spec.n_kv_heads > changes["n_heads"]:
        changes["n_kv_heads"] = changes["n_heads"]
    try:
        spec = dataclasses.replace(spec, **changes)
    except ValueError as err:
        raise UsageError(f"invalid model override: {err}") from None
    return ModelFacts(spec=spec, hf_config=config, hf_path=hf_path,
                      description=f"{spec.name} ({spec.n_params() / 1e6:,.1f}M parameters)")


def hf_model_class(facts: ModelFacts):
    """The transformers class that will be built, checked to be a causal LM whose attention autosp can
    shard (``F.scaled_dot_product_attention``). Imports transformers."""
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    except ImportError:
        raise UsageError(f"{facts.hf_path} is a Hugging Face config and building it needs transformers: "
                         f"{install_hint('hf')}") from None
    config = dict(facts.hf_config)
    model_type = config.pop("model_type", None)
    if not model_type:
        raise UsageError(f"model config {facts.hf_path} has no model_type; is it a Hugging Face config.json?")
    from autosp.cost_models.architectures import ATTENTION_SINK_TYPES, check_config

    check_config(facts.hf_config, str(facts.hf_path))  # the list the planner and autosp.compile refuse too
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
    except (ValueError, KeyError) as err:
        raise UsageError(f"transformers {transformers.__version__} does not know model_type {model_type!r} of "
                         f"{facts.hf_path} ({str(err).splitlines()[0][:160]}); upgrade transformers or pick "
                         "another model") from None
    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    except KeyError:
        raise UsageError(f"{facts.hf_path} ({model_type}) is not a causal language model transformers can "
                         "build (AutoModelForCausalLM); autosp trains decoder-only causal LMs") from None
    # Gemma 2 has no SDPA path (soft-capping), gpt-oss none either (attention sinks); autosp runs both attentions
    # itself (compiler/softcapping.py, compiler/sinks.py)
    if not getattr(cls, "_supports_sdpa", False) and not getattr(hf_config, "attn_logit_softcapping", None) \
            and model_type not in ATTENTION_SINK_TYPES:
        raise UsageError(f"{cls.__name__} ({facts.hf_path}) cannot run its attention through "
                         f"torch.nn.functional.scaled_dot_product_attention in transformers "
                         f"{transformers.__version__}, and that is where autosp shards attention; autosp-train "
                         "trains models whose attention does (Llama, Mistral, Qwen2, ...)")
    return cls, hf_config


def check_parallel(candidate, facts: ModelFacts, launch: Launch, plan_path: str | None) -> None:
    """The plan's processes against the launch, and the model's heads against the SP degree."""
    need = candidate.sp * candidate.dp
    if launch.world != need:
        what = f"{plan_path} needs" if plan_path else f"sp {candidate.sp} x dp {candidate.dp} needs"
        nnodes = launch.nnodes
        if launch.launcher == "env":
            how = f"relaunch with {need} processes (e.g. torchrun --nproc-per-node {need} -m autosp.compiler.train_cli ...)"
        elif nnodes > 1 and need % nnodes == 0:
            how = f"start each of the {nnodes} nodes with --nproc-per-node {need // nnodes}"
        else:
            how = (f"run autosp-train --nproc-per-node {need} ... on one machine, or --nnodes K --nproc-per-node "
                   f"{need}/K on each of K machines")
        raise UsageError(f"{what} {need} processes (sp {candidate.sp} x dp {candidate.dp}) and this launch has "
                         f"{launch.world}{f' ({launch.shape()})' if launch.launcher == 'spawn' else ''}: {how}")
    spec = facts.spec
    ulysses = getattr(candidate, "ulysses", candidate.sp)
    if spec.n_heads % ulysses:
        raise UsageError(f"{spec.name}'s {spec.n_heads} attention heads do not divide over {ulysses} Ulysses "
                         f"ranks; use a Ulysses degree (sp / ring) that divides {spec.n_heads}, or a larger ring (--ring)")
    if spec.n_kv_heads % ulysses and ulysses % spec.n_kv_heads:
        raise UsageError(f"{spec.name}'s {spec.n_kv_heads} key/value heads and Ulysses degree {ulysses} (sp / ring): "
                         "one must divide the other")


def check_host_memory(facts: ModelFacts, launch: Launch, candidate, seq: int) -> None:
    """Every process on this machine first builds the whole model in fp32 host memory (DeepSpeed moves and
    partitions it afterwards) and holds the full batch of token ids (int64): refuse when those alone cannot
    fit, rather than be killed minutes later."""
    from autosp.profiling.calibration.limits import available_memory

    available = available_memory()
    if available is None:
        return
    local = launch.local_world
    weights = local * facts.spec.n_params() * FP32_BYTES
    if weights > available:
        raise InfeasibleError(
            f"building {facts.description} in each of the {local} process(es) on this machine needs at least "
            f"{weights / 2**30:,.1f} GiB of host memory for its fp32 weights alone, and {available / 2**30:,.1f} GiB "
            "are available: train a smaller model (--layers, --hidden), fewer processes per machine, or more machines")
    rows = candidate.dp * candidate.micro_batch
    ids = local * rows * seq * INT64_BYTES
    if weights + ids > available:
        raise InfeasibleError(
            f"{rows} sequence(s) of {seq:,} tokens in each of the {local} process(es) need {ids / 2**30:,.1f} GiB of "
            f"host memory for their token ids alone, and {available / 2**30:,.1f} GiB are available (after the "
            "weights): use a shorter --ctx")


def open_tokens(path: str, data_dtype: str, vocab: int, seq: int):
    """The token ids of ``path`` as a read-only numpy array (memory-mapped where the format allows),
    checked to be integers in ``[0, vocab)`` and at least one sequence plus its next token long."""
    import numpy as np

    from autosp.files import file_kind

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"--data {path}: no such file (or use --data synthetic)") from None
    except OSError as err:
        raise UsageError(f"--data {path}: {err.strerror or err}") from None
    import stat as stat_module

    if not stat_module.S_ISREG(st.st_mode):
        raise UsageError(f"--data {path} is {file_kind(st.st_mode)}; give a token file (.npy, .pt or .bin)")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TOKEN_SUFFIXES:
        raise UsageError(f"--data {path}: unknown data type {suffix or '(none)'!r}; use token ids (.npy or .pt: a 1-D "
                         "integer array / tensor; .bin: raw --data-dtype token ids) or text (.jsonl, .txt, .parquet or "
                         "a save_to_disk directory)")
    try:
        if suffix == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        elif suffix == ".pt":
            import torch

            tensor = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(tensor, torch.Tensor):
                raise UsageError(f"--data {path} holds a {type(tensor).__name__}, not a tensor of token ids")
            array = tensor.numpy()
        else:
            try:
                dtype = np.dtype(data_dtype)
            except TypeError:
                raise UsageError(f"unknown --data-dtype {data_dtype!r}; e.g. uint16, uint32, int32, int64") from None
            if dtype.kind not in "iu":
                raise UsageError(f"--data-dtype {data_dtype}: token ids are integers; e.g. uint16, uint32, int64")
            if st.st_size % dtype.itemsize:
                raise UsageError(f"--data {path} is {st.st_size:,} bytes, not a whole number of {data_dtype} tokens; "
                                 "is --data-dtype right?")
            if st.st_size == 0:
                raise UsageError(f"--data {path} is empty")
            array = np.memmap(path, dtype=dtype, mode="r")
    except UsageError:
        raise
    except (ValueError, OSError, RuntimeError, EOFError) as err:  # not a .npy / torch file, truncated, pickled
        raise UsageError(f"--data {path} cannot be read as {suffix} token ids: {str(err).splitlines()[0][:160]}") from None
    if array.dtype.kind not in "iu":
        raise UsageError(f"--data {path} holds {array.dtype} values; token files hold integer token ids "
                         "(convert with array.astype('int64') if they are ids)")
    array = array.reshape(-1)
    if array.size < seq + 1:
        raise UsageError(f"--data {path} holds {array.size:,} tokens, fewer than one sequence of {seq:,} plus its "
                         "next token")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise UsageError(f"--data {path} has token id {bad} but the model's vocabulary is 0..{vocab - 1}")
    return array
