"""The DeepSpeed ZeRO buffer settings autosp plans with.

The DeepSpeed config writer (planner) copies these values into ``zero_optimization`` and the cost model
(:mod:`autosp.cost_models.memory` and :mod:`autosp.cost_models.comm`) charges memory and time for
them, so the config and the prediction agree. Sizes are in *elements* (DeepSpeed's unit), not bytes.

DeepSpeed's defaults (``deepspeed/runtime/zero/config.py``) are reduce/allgather buckets of 5e8
elements; with ``overlap_comm`` at stages 1-2 DeepSpeed 0.19.8 allocates two gradient staging buffers of
``reduce_bucket_size`` elements (``DeepSpeedZeroOptimizer.setup_buckets`` in
``deepspeed/runtime/zero/stage_1_and_2.py``: ``buf_0`` and, with overlap_comm, ``buf_1``), 2 GB in bf16
at the default. (DeepSpeed's docs still say "4.5x the allgather_bucket_size and reduce_bucket_size";
studies/knob_costs.py measured the two buffers and nothing else.) Long-context training needs that memory for activations, so
autosp uses 10x smaller buckets: 5e7 elements still amortise the collective latency (a 100 MB bf16
bucket takes ~0.3 ms on NVLink, ~2 ms on 400 Gb/s InfiniBand against ~10 us of latency).
"""

REDUCE_BUCKET_SIZE = 50_000_000
"""``reduce_bucket_size``: gradient elements reduced per collective (stages 0-3)."""

ALLGATHER_BUCKET_SIZE = 50_000_000
"""``allgather_bucket_size``: parameter elements all-gathered per collective after the step (stages 1-2)."""

STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
"""``stage3_prefetch_bucket_size``: parameter elements fetched ahead of use (stage 3; DeepSpeed default)."""

STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
"""``stage3_max_live_parameters``: gathered parameter elements kept before release (stage 3; default)."""

STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
"""``stage3_max_reuse_distance``: keep a gathered parameter if it is reused within this many elements."""

STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold``: parameters smaller than this stay gathered (norms, biases)."""

OVERLAP_COMM = True
"""``overlap_comm``: overlap gradient reduction with the backward pass (a second staging buffer at 1-2)."""

CONTIGUOUS_GRADIENTS = True
"""``contiguous_gradients``: copy gradients into one contiguous buffer as they are produced."""

STAGING_BUFFERS = 2 if OVERLAP_COMM else 1
"""Gradient staging buffers of ``reduce_bucket_size`` elements ZeRO 1-2 allocates (double-buffered with
overlap_comm; stage_1_and_2.py ``setup_buckets``)."""


def reduce_bucket_elements(n_params: float | None = None) -> int:
    """``reduce_bucket_size`` for a model of ``n_params`` parameters: REDUCE_BUCKET_SIZE, never more than
    the model. DeepSpeed allocates its staging buffers at the configured size whatever the model
    (studies/knob_costs.py measured 2 x 5e7 fp32 elements for a 7M-parameter model), so a bucket larger
    than the model is memory spent on nothing."""
    if n_params is None:
        return REDUCE_BUCKET_SIZE
    return int(min(REDUCE_BUCKET_SIZE, max(1, n_params)))


def zero_config_fields(stage: int, n_params: float | None = None) -> dict:
    """The ``zero_optimization`` keys these constants correspond to, for the config writer."""
    fields = {
        "stage": stage,
        "overlap_comm": OVERLAP_COMM,
        "contiguous_gradients": CONTIGUOUS_GRADIENTS,
        "reduce_bucket_size": reduce_bucket_elements(n_params),
    }
    if stage in (1, 2):
        fields["allgather_bucket_size"] = ALLGATHER_BUCKET_SIZE
    if stage == 3:
        fields.update({
            "stage3_prefetch_bucket_size": STAGE3_PREFETCH_BUCKET_SIZE,
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE,
            "stage3_param_persistence_threshold": STAGE3_PARAM_PERSISTENCE_THRESHOLD,
        })
    return fields


__all__ = ["ALLGATHER_BUCKET_SIZE", "CONTIGUOUS_GRADIENTS", "OVERLAP_COMM", "REDUCE_BUCKET_SIZE",
           "STAGE3_MAX_LIVE_PARAMETERS", "STAGE3_MAX_REUSE_DISTANCE", "STAGE3_PARAM_PERSISTENCE_THRESHOLD",
           "STAGE3_PREFETCH_BUCKET_SIZE", "STAGING_BUFFERS", "reduce_bucket_elements", "zero_config_fields"]
