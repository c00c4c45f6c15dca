"""The ``search`` section of a plan that :func:`autosp.planner.api.plan_for` writes, as a typed dataclass.

:meth:`SearchInfo.to_dict` gives the plan JSON's ``search`` object, keys in the same order as ever: the fields
every search records, then those that only some plans carry (left out when unset), then the strategy's own
details. A plan read back from a file keeps its ``search`` as a dict (older plans, and those ``autosp-plan
select`` writes, carry other keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class SearchInfo:
    strategy: str
    requested_search: str  # what a re-check asks for (a small space asked of Optuna is scored whole)
    sampler: str
    trials: int | None
    evaluations: int
    space_size: int
    space_version: str
    cost_model_version: str
    code_version: str
    seed: int
    allow_cross_node_sp: bool
    search_wall_time_s: float
    time_budget_s: float | None
    wall_time_s: float
    cache: str  # "miss" (searched, then stored) or "off"; a hit is the stored plan
    padding_tokens: int
    padding_fraction: float
    attention_kernel: str | None
    # only some plans carry these (absent from the JSON when None)
    attention: dict | None = None  # the attention share of a packed or sliding-window workload
    model_profile: str | None = None  # "graph FINGERPRINT" or "analytic fallback (why)"
    fixed: dict | None = None  # the pinned knobs
    max_ctx_tokens: int | None = None
    max_ctx_granule: int | None = None
    details: dict = field(default_factory=dict)  # the strategy's own counts (SearchResult.details)
    measured: list | None = None  # the measured trials' table
    excluded_sp: dict | None = None  # {sp: why the space leaves it out}

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "details":
                out.update({k: v for k, v in value.items() if k != "space_size"})
            elif value is not None or f.name not in OPTIONAL:
                out[f.name] = value
        return out


OPTIONAL = frozenset({"attention", "model_profile", "fixed", "max_ctx_tokens", "max_ctx_granule", "measured",
                      "excluded_sp"})
"""The fields a plan's JSON carries only when set."""

__all__ = ["OPTIONAL", "SearchInfo"]
