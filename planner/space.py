"""The search space: which candidates exist for a (model, hardware, workload), and why others do not.

A candidate (:class:`autosp.cost_models.specs.Candidate`) sets every knob the compiler applies. The space
is the product of the knob choices below, cut down by the validity rules; :func:`invalid_reason`
returns the first rule a candidate breaks (one line, for the report and the errors) or ``None``.

Knobs and choices

- ``sp``: a divisor of the world size. The SP group lives inside one node unless cross-node SP is
  allowed; then a group must tile whole nodes (sp a multiple of the devices per node).
- ``dp = world / sp``; every rank is in exactly one SP group and one DP group.
- ``zero_stage``: 0-3 (model states sharded over all dp x sp ranks, docs/design.md section 3).
- ``micro_batch`` in :data:`MICRO_BATCHES`; ``grad_accum`` follows from ``--global-batch``:
  global_batch = dp x micro_batch x grad_accum sequences. Without a global batch, grad_accum is 1 and a
  step trains dp x micro_batch sequences.
- ``checkpointing``: none / selective / sequence / full.
- ``mlp_chunks`` in :data:`MLP_CHUNKS`, ``loss_chunks`` in :data:`LOSS_CHUNKS` (sequence tiling).
- ``offload_activations``: only with a checkpointing policy (it moves the checkpointed tensors).
- ``offload_optimizer``: ZeRO-Offload (master weights, Adam states and the step on the host, CPU
  Adam); only with ZeRO stage >= 1.
- ``overlap``: none / kv_async / head_pipeline; only with sp > 1 (with sp = 1 there is no all-to-all).

Validity rules (docs/design.md section 2)

- query heads divide by sp; KV heads either divide by sp (sharded) or divide sp (replicated
  sp / n_kv times before the all-to-all); anything else is invalid;
- ``head_pipeline`` needs at least two local query heads to pipeline;
- a sequence that does not divide by sp is padded up to a multiple of sp (pad tokens carry ignored
  labels): valid, and :func:`padding` says how much is wasted;
- ``loss_chunks > 1`` at ZeRO stage 3 only for untied embeddings (:func:`zero3_loss_ok`);
- tiling: a chunk count above 1 must leave tiles of at least :data:`MIN_TILE_TOKENS` tokens of the
  tokens one rank holds (padded length / sp); so short contexts are not tiled and long ones may be
  tiled finely (ALST tiles its MLP in about seq_len / hidden pieces);
- with a global batch, it must split evenly into dp x micro_batch x grad_accum.

Canonical form: knobs that cannot matter are fixed (``overlap='none'`` when sp = 1;
``offload_activations=False`` without checkpointing; ``offload_optimizer=False`` at ZeRO stage 0), so
no two candidates of the space mean the same training run. :data:`SPACE_VERSION` changes whenever this file changes; plan caches key on it.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path

from autosp.cost_models.specs import CHECKPOINTING_POLICIES, OVERLAP_SCHEDULES, Candidate, HardwareSpec, ModelSpec, Workload

ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8)
MLP_CHUNKS = (1, 2, 4, 8, 16, 32, 64)
LOSS_CHUNKS = (1, 2, 4, 8, 16, 32, 64, 128)
OFFLOAD = (False, True)
MIN_TILE_TOKENS = 1024
"""A tiled MLP or logits+loss chunk holds at least this many tokens: smaller tiles only add kernel
launches and lose GEMM efficiency while saving memory that no longer matters."""

SPACE_REVISION = 3
"""Bump by hand when the meaning of the space changes; the source hash below catches the rest."""

SPACE_VERSION = f"{SPACE_REVISION}-{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:10]}"


def padded_length(seq_len: int, sp: int) -> int:
    """The sequence length after padding to a multiple of ``sp``."""
    return -(-seq_len // sp) * sp


def padding(seq_len: int, sp: int) -> tuple[int, float]:
    """(pad tokens, fraction of the padded sequence that is padding)."""
    padded = padded_length(seq_len, sp)
    return padded - seq_len, (padded - seq_len) / padded


def local_tokens(seq_len: int, sp: int) -> int:
    """Tokens of one sequence held by one rank of the SP group."""
    return padded_length(seq_len, sp) // sp


def tile_ok(chunks: int, tokens: int) -> bool:
    """Whether ``chunks`` tiles of ``tokens`` tokens each hold at least MIN_TILE_TOKENS (1 always does)."""
    return chunks == 1 or tokens // chunks >= MIN_TILE_TOKENS


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sp_reason(model: ModelSpec, hw: HardwareSpec, sp: int, allow_cross_node_sp: bool = False) -> str | None:
    """Why SP degree ``sp`` is impossible for this model and cluster, or None."""
    world, per_node = hw.world_size, hw.devices_per_node
    if sp < 1 or world % sp:
        return f"sp={sp} does not divide the world size {world}"
    if sp > per_node:
        if not allow_cross_node_sp:
            return (f"sp={sp} spans nodes ({per_node} GPUs per node); SP groups stay inside a node "
                    f"unless --allow-cross-node-sp")
        if sp % per_node:
            return f"sp={sp} would split a node of {per_node} GPUs between SP groups"
    elif per_node % sp:
        return f"sp={sp} does not divide the {per_node} GPUs of a node"
    if model.n_heads % sp:
        return f"{model.n_heads} query heads do not divide by sp={sp}"
    kv = model.n_kv_heads
    if kv % sp and sp % kv:
        return f"{kv} KV heads neither divide by sp={sp} nor divide it"
    return None


def zero3_loss_ok(model: ModelSpec, zero_stage: int, loss_chunks: int) -> bool:
    """The one rule that couples two knobs once sp is fixed. Under ZeRO-3 the compiler tiles the loss by
    keeping the LM head gathered and traced inline with the loss (compiler/zero3.py); with tied
    embeddings DeepSpeed releases that shared weight after the embedding's forward, so the pair is not
    offered for tied models (compiler/api.py rejects it too)."""
    return zero_stage < 3 or loss_chunks == 1 or not model.tied_embeddings


def invalid_reason(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
                   allow_cross_node_sp: bool = False) -> str | None:
    """The first validity rule ``cand`` breaks, as one line; None when it is valid and canonical."""
    if cand.sp * cand.dp != hw.world_size:
        return f"sp x dp = {cand.sp} x {cand.dp} is not the world size {hw.world_size}"
    reason = sp_reason(model, hw, cand.sp, allow_cross_node_sp)
    if reason:
        return reason
    if cand.overlap != "none" and cand.sp == 1:
        return f"overlap {cand.overlap!r} needs an all-to-all (sp > 1)"
    if cand.overlap == "head_pipeline" and model.n_heads // cand.sp < 2:
        return f"head_pipeline needs at least 2 local query heads, sp={cand.sp} leaves {model.n_heads // cand.sp}"
    if not zero3_loss_ok(model, cand.zero_stage, cand.loss_chunks):
        return "loss_chunks > 1 is not supported with zero_stage=3 for a model with tied embeddings"
    tokens = local_tokens(workload.seq_len, cand.sp)
    for name in ("mlp_chunks", "loss_chunks"):
        chunks = getattr(cand, name)
        if not tile_ok(chunks, tokens):
            return (f"{name}={chunks} would cut the {tokens} tokens per rank into tiles smaller than "
                    f"{MIN_TILE_TOKENS}")
    gb = workload.global_batch
    if gb is None:
        if cand.grad_accum != 1:
            return "grad_accum > 1 needs --global-batch"
    else:
        if gb % cand.dp:
            return f"global batch {gb} does not divide by dp={cand.dp}"
        if (gb // cand.dp) % cand.micro_batch:
            return f"global batch {gb} / dp={cand.dp} does not divide by micro_batch={cand.micro_batch}"
        if gb != cand.dp * cand.micro_batch * cand.grad_accum:
            return (f"dp x micro_batch x grad_accum = {cand.dp * cand.micro_batch * cand.grad_accum} "
                    f"is not the global batch {gb}")
    return None


def canonical(cand: Candidate) -> Candidate:
    """Fix the knobs that cannot matter, so equal training runs compare equal."""
    changes = {}
    if cand.sp == 1 and cand.overlap != "none":
        changes["overlap"] = "none"
    if cand.checkpointing == "none" and cand.offload_activations:
        changes["offload_activations"] = False
    if cand.zero_stage == 0 and cand.offload_optimizer:
        changes["offload_optimizer"] = False
    return replace(cand, **changes) if changes else cand


def make_candidate(world: int, global_batch: int | None, *, sp: int, zero_stage: int, micro_batch: int,
                   checkpointing: str, mlp_chunks: int, loss_chunks: int, offload_activations: bool,
                   overlap: str, offload_optimizer: bool = False) -> Candidate:
    """A canonical candidate from knob values; dp and grad_accum follow from the world and global batch.

    When the global batch does not split into dp x micro_batch, grad_accum stays 1 and
    :func:`invalid_reason` reports the problem.
    """
    dp = world // sp
    grad_accum = 1
    if global_batch is not None and global_batch % (dp * micro_batch) == 0:
        grad_accum = global_batch // (dp * micro_batch)
    return Candidate(sp=sp, dp=dp, zero_stage=zero_stage, micro_batch=micro_batch, grad_accum=grad_accum,
                     checkpointing=checkpointing, mlp_chunks=mlp_chunks, loss_chunks=loss_chunks,
                     offload_activations=offload_activations and checkpointing != "none",
                     overlap=overlap if sp > 1 else "none",
                     offload_optimizer=offload_optimizer and zero_stage >= 1)


@dataclass(frozen=True)
class SearchSpace:
    """The knob choices for one request; :meth:`candidates` enumerates the valid canonical points."""

    model: ModelSpec
    hardware: HardwareSpec
    workload: Workload
    allow_cross_node_sp: bool = False
    sp: tuple[int, ...] = ()
    excluded_sp: tuple[tuple[int, str], ...] = ()
    zero_stage: tuple[int, ...] = ZERO_STAGES
    micro_batch: tuple[int, ...] = MICRO_BATCHES
    checkpointing: tuple[str, ...] = CHECKPOINTING_POLICIES
    mlp_chunks: tuple[int, ...] = MLP_CHUNKS
    loss_chunks: tuple[int, ...] = LOSS_CHUNKS
    offload_activations: tuple[bool, ...] = OFFLOAD
    overlap: tuple[str, ...] = OVERLAP_SCHEDULES
    offload_optimizer: tuple[bool, ...] = OFFLOAD
    profile: object = field(default=None, compare=False, repr=False)
    """The model's :class:`~autosp.cost_models.profile.ModelProfile` when it is graph-derived (a model that
    is not a preset); None prices ``model`` with the analytic profile. Travels with :meth:`with_workload`."""

    KNOBS = ("sp", "zero_stage", "micro_batch", "checkpointing", "mlp_chunks", "loss_chunks",
             "offload_activations", "overlap", "offload_optimizer")

    def choices(self) -> dict[str, tuple]:
        return {name: getattr(self, name) for name in self.KNOBS}

    def make(self, **knobs) -> Candidate:
        return make_candidate(self.hardware.world_size, self.workload.global_batch, **knobs)

    def make_nearest(self, **knobs) -> Candidate:
        """Like :meth:`make`, but a tiling level or micro-batch that is invalid with the chosen sp is
        moved to the nearest valid one below it (for samplers that propose knobs independently)."""
        per = self.per_sp_choices(knobs["sp"])
        if per is not None:
            for name in ("mlp_chunks", "loss_chunks", "micro_batch"):
                valid = per[name]
                if valid and knobs[name] not in valid:
                    below = [v for v in valid if v <= knobs[name]]
                    knobs = dict(knobs, **{name: below[-1] if below else valid[0]})
        if not zero3_loss_ok(self.model, knobs["zero_stage"], knobs["loss_chunks"]):
            knobs = dict(knobs, loss_chunks=1)
        return self.make(**knobs)

    def min_seq_len(self, cand: Candidate) -> int:
        """The shortest sequence at which ``cand``'s tiling is valid (tiles of MIN_TILE_TOKENS)."""
        chunks = max(cand.mlp_chunks, cand.loss_chunks)
        return 1 if chunks == 1 else cand.sp * chunks * MIN_TILE_TOKENS

    def reason(self, cand: Candidate, workload: Workload | None = None) -> str | None:
        return invalid_reason(self.model, self.hardware, workload or self.workload, cand, self.allow_cross_node_sp)

    def with_workload(self, workload: Workload) -> "SearchSpace":
        """The space of the same request at another workload (the tiling choices depend on its length)."""
        return build_space(self.model, self.hardware, workload, self.allow_cross_node_sp, profile=self.profile)

    def per_sp_choices(self, sp: int) -> dict[str, tuple] | None:
        """The knob values valid together with ``sp`` (every rule but :func:`zero3_loss_ok` is separable once sp
        is fixed)."""
        if sp_reason(self.model, self.hardware, sp, self.allow_cross_node_sp):
            return None
        tokens = local_tokens(self.workload.seq_len, sp)
        gb, dp = self.workload.global_batch, self.hardware.world_size // sp
        if gb is None:
            micro = self.micro_batch
        else:
            micro = tuple(m for m in self.micro_batch if gb % (dp * m) == 0)
        overlap = tuple(o for o in self.overlap
                        if o == "none" or (sp > 1 and (o != "head_pipeline" or self.model.n_heads // sp >= 2)))
        return {"zero_stage": self.zero_stage, "micro_batch": micro, "checkpointing": self.checkpointing,
                "mlp_chunks": tuple(c for c in self.mlp_chunks if tile_ok(c, tokens)),
                "loss_chunks": tuple(c for c in self.loss_chunks if tile_ok(c, tokens)),
                "offload_activations": self.offload_activations, "overlap": overlap,
                "offload_optimizer": self.offload_optimizer}

    def candidates(self):
        """Every valid canonical candidate, in a fixed order (deterministic searches and ties)."""
        for sp in self.sp:
            per = self.per_sp_choices(sp)
            if per is None:
                continue
            for zero, optim, micro, ckpt, mlp, loss, offload, overlap in itertools.product(
                    per["zero_stage"], per["offload_optimizer"], per["micro_batch"], per["checkpointing"],
                    per["mlp_chunks"], per["loss_chunks"], per["offload_activations"], per["overlap"]):
                if offload and ckpt == "none":
                    continue  # canonical: offload needs checkpointed tensors
                if optim and zero == 0:
                    continue  # canonical: ZeRO-Offload needs ZeRO
                if not zero3_loss_ok(self.model, zero, loss):
                    continue
                yield self.make(sp=sp, zero_stage=zero, micro_batch=micro, checkpointing=ckpt, mlp_chunks=mlp,
                                loss_chunks=loss, offload_activations=offload, overlap=overlap,
                                offload_optimizer=optim)

    def size(self) -> int:
        """len(list(self.candidates())), without building them."""
        total = 0
        for sp in self.sp:
            per = self.per_sp_choices(sp)
            if per is None:
                continue
            acts, optims = per["offload_activations"], per["offload_optimizer"]
            n_ckpt_offload = sum((False in acts) + (c != "none" and True in acts) for c in per["checkpointing"])
            n_zero_loss_optim = sum(((False in optims) + (z >= 1 and True in optims))
                                    * sum(zero3_loss_ok(self.model, z, c) for c in per["loss_chunks"]) for z in per["zero_stage"])
            total += (n_zero_loss_optim * len(per["micro_batch"]) * n_ckpt_offload * len(per["mlp_chunks"])
                      * len(per["overlap"]))
        return total

    def neighbours(self, cand: Candidate):
        """Valid candidates one move away from ``cand`` (for local refinement).

        A move changes one knob; changing sp also tries every overlap schedule (sp = 1 has none to
        keep) and the micro-batch that keeps the tokens per GPU constant (sp and micro-batch trade).
        """
        base = {k: getattr(cand, k) for k in self.KNOBS}
        choices = self.choices()
        seen = {cand}
        for name in self.KNOBS:
            for value in choices[name]:
                if value == base[name]:
                    continue
                variants = [{name: value}]
                if name == "sp":
                    scaled = base["micro_batch"] * value // base["sp"]
                    micro = {base["micro_batch"]}
                    if scaled * base["sp"] == base["micro_batch"] * value and scaled in choices["micro_batch"]:
                        micro.add(scaled)
                    overlaps = choices["overlap"] if value > 1 else ("none",)
                    variants = [{"sp": value, "micro_batch": m, "overlap": o} for m in sorted(micro) for o in overlaps]
                for change in variants:
                    other = self.make(**{**base, **change})
                    if other not in seen and not self.reason(other):
                        seen.add(other)
                        yield other

def build_space(model: ModelSpec, hw: HardwareSpec, workload: Workload, allow_cross_node_sp: bool = False,
                micro_batches: tuple[int, ...] | None = None, profile=None) -> SearchSpace:
    """The space for one request. ``micro_batches`` overrides the micro-batch choices (max-ctx uses 1);
    ``profile`` is the model's graph-derived ModelProfile (None: the analytic one of ``model``)."""
    valid, excluded = [], []
    for sp in divisors(hw.world_size):
        reason = sp_reason(model, hw, sp, allow_cross_node_sp)
        if reason is None:
            valid.append(sp)
        else:
            excluded.append((sp, reason))
    mb = MICRO_BATCHES if micro_batches is None else tuple(micro_batches)
    # tiling levels no sp can use at this length are left out (they would only waste samples)
    most = local_tokens(workload.seq_len, min(valid)) if valid else 0
    mlp = tuple(c for c in MLP_CHUNKS if tile_ok(c, most)) or (1,)
    loss = tuple(c for c in LOSS_CHUNKS if tile_ok(c, most)) or (1,)
    if workload.global_batch is not None:
        # Only micro-batches that can divide some replica's share of the global batch.
        mb = tuple(m for m in mb if any(workload.global_batch % (hw.world_size // sp * m) == 0 for sp in valid))
        mb = mb or (1,)
    return SearchSpace(model=model, hardware=hw, workload=workload, allow_cross_node_sp=allow_cross_node_sp,
                       sp=tuple(valid), excluded_sp=tuple(excluded), micro_batch=mb, mlp_chunks=mlp,
                       loss_chunks=loss, profile=profile)
