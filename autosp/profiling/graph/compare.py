"""Graph profile vs analytic formulas, field by field (plain Python: reads two ModelProfiles).

Every row is per token and per decoder layer unless its unit says otherwise, in bytes at bf16 with
no KV replication (sp <= n_kv). ``why`` names the documented reason of a difference (see
docs/graph_profile.md, "Cross-check"); an empty ``why`` means the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from autosp.cost_models.memory import layer_transient_phases
from autosp.cost_models.profile import ModelProfile
from autosp.cost_models.shapes import Shapes
from autosp.cost_models.specs import CHECKPOINTING_POLICIES, Candidate, ModelSpec, Workload

E = 2  # bf16


@dataclass(frozen=True)
class Row:
    field: str
    unit: str
    graph: float
    analytic: float
    why: str = ""

    @property
    def rel(self) -> float:
        if self.analytic == self.graph:
            return 0.0
        if self.analytic == 0:
            return float("inf")
        return (self.graph - self.analytic) / abs(self.analytic)


def _transient(profile: ModelProfile, policy: str) -> float:
    sh = Shapes(_spec_of(profile), Workload(seq_len=1), Candidate(sp=1), profile)
    mlp, mlp_fixed, attn, attn_fixed = layer_transient_phases(sh, policy, 1)
    return max(E * mlp + mlp_fixed, E * attn + attn_fixed)


def _spec_of(profile: ModelProfile) -> ModelSpec:
    return profile.model_spec()


def _elems_bytes(el) -> float:
    return el.bytes(E, 1)


def comparison(graph: ModelProfile, analytic: ModelProfile) -> list[Row]:
    """The rows of the cross-check table."""
    g, a = graph, analytic
    rows = [
        Row("parameters (model)", "count", g.n_params, a.n_params),
        Row("parameters (one layer)", "count", g.layer_params, a.layer_params),
        Row("matmul FLOPs fwd, layer", "FLOP/token", 2 * g.layer_matmul, 2 * a.layer_matmul),
        Row("matmul FLOPs fwd, MLP", "FLOP/token", 2 * g.mlp_matmul, 2 * a.mlp_matmul),
        Row("matmul FLOPs fwd, LM head", "FLOP/token", 2 * g.head_matmul, 2 * a.head_matmul),
        Row("matmul bwd / fwd", "ratio", g.matmul_bwd_factor, a.matmul_bwd_factor),
        Row("attention FLOPs fwd, layer", "FLOP/S^2", 2 * g.attn_width, 2 * a.attn_width),
        Row("attention bwd / fwd", "ratio", g.attn_bwd_factor, a.attn_bwd_factor),
        Row("Ulysses all-to-all, layer fwd", "B/token", (2 * g.q_dim + 2 * g.kv_dim) * E,
            (2 * a.q_dim + 2 * a.kv_dim) * E),
    ]
    for i, policy in enumerate(CHECKPOINTING_POLICIES):
        rows.append(Row(f"kept, {policy}", "B/token", g.saved_bytes_per_token(policy, E),
                        a.saved_bytes_per_token(policy, E)))
    for policy in CHECKPOINTING_POLICIES:
        rows.append(Row(f"backward working set, {policy}", "B/token", _transient(g, policy), _transient(a, policy)))
    rows += [
        Row("kept outside the layers", "B/token", _elems_bytes(g.final), _elems_bytes(a.final)),
        Row("logits alive in the layers' backward", "B/token", _elems_bytes(g.logits), _elems_bytes(a.logits)),
        Row("loss peak", "B/token", _elems_bytes(g.loss_peak), _elems_bytes(a.loss_peak)),
        Row("pointwise traffic fwd, layer", "B/token", g.pw_layer_fwd.bytes(E), a.pw_layer_fwd.bytes(E)),
        Row("pointwise traffic bwd / fwd", "ratio", g.pw_bwd_factor, a.pw_bwd_factor),
        Row("loss traffic fwd + bwd", "B/token", g.loss_pw_fwd + g.loss_pw_bwd, a.loss_pw_fwd + a.loss_pw_bwd),
    ]
    return [_explain(r, g, a) for r in rows]


def _explain(row: Row, g: ModelProfile, a: ModelProfile) -> Row:
    if row.graph == row.analytic:
        return row
    d = dict(g.details)
    reasons = []
    name = row.field
    gated, llama_like = d.get("gated_mlp", True), d.get("gated_mlp", True) and not d.get("qkv_bias", False)
    if name.startswith("parameters") or name.startswith("matmul FLOPs"):
        if not gated:
            reasons.append("MLP not gated")
        if d.get("qkv_bias") or not gated:
            reasons.append("biases")
        if name == "parameters (model)":
            reasons.append("embeddings/positions outside the Llama formula")
    fp32_norm = any(c == "norm" and v > 0 for c, v in d.get("saved_by_class", ())) and d.get("norm_fp32_upcast")
    if name.startswith("kept") or name.startswith("backward working set") or name == "kept outside the layers":
        reasons.append("eager fp32 norm upcast" if fp32_norm else "what the norms/activation save")
    if name == "kept outside the layers" and d.get("shared_saved_bytes_per_token", 0) > 0:
        reasons.append("shared rotary tables")
    if name.startswith("backward working set"):
        reasons.append("measured gradient working set")
    if name.startswith("pointwise") or name.startswith("loss traffic"):
        reasons.append("fused-region traffic model")
    if not llama_like and not reasons:
        reasons.append("architecture")
    return Row(row.field, row.unit, row.graph, row.analytic, "; ".join(dict.fromkeys(reasons)) or "see docs")


def format_table(rows: list[Row], title: str = "") -> str:
    def fmt(v: float) -> str:
        if isinstance(v, float) and not v.is_integer():
            return f"{v:,.3f}"
        return f"{int(v):,}"

    lines = []
    if title:
        lines.append(title)
    header = f"{'field':38s} {'unit':11s} {'graph':>16s} {'analytic':>16s} {'diff':>8s}  why"
    lines.append(header)
    lines.append("-" * len(header))
    for r in rows:
        rel = "=" if r.rel == 0 else ("new" if r.rel == float("inf") else f"{100 * r.rel:+.1f}%")
        lines.append(f"{r.field:38s} {r.unit:11s} {fmt(r.graph):>16s} {fmt(r.analytic):>16s} {rel:>8s}  {r.why}")
    return "\n".join(lines)


__all__ = ["Row", "comparison", "format_table"]
