"""The human-readable plan report ``autosp-plan`` prints (``--json`` prints the plan JSON instead)."""

from __future__ import annotations

import re
import textwrap

from autosp.contract.knobs import REPORT_ROWS
from autosp.units import GIB, format_gib, format_seconds, format_tokens

BAR_WIDTH = 24
_EIGHTHS = " ▏▎▍▌▋▊▉"


def _unicode_ok(encoding: str | None) -> bool:
    try:
        "█▏·×→".encode(encoding or "ascii")
        return True
    except (UnicodeEncodeError, LookupError):
        return False


def bar(fraction: float, width: int = BAR_WIDTH, unicode: bool = True) -> str:
    """A horizontal bar for 0..1 (over 1 is drawn full and marked with '!')."""
    over = fraction > 1
    fraction = min(max(fraction, 0.0), 1.0)
    if not unicode:
        filled = round(fraction * width)
        return "#" * filled + "." * (width - filled) + ("!" if over else "")
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text + " " * (width - len(text)) + ("!" if over else "")


def _hw_line(hw) -> str:
    acc = hw.accelerator
    kernel = f", attention kernel {hw.attention_kernel}" if getattr(hw, "attention_kernel", "") else ""
    if hw.nodes > 1:
        return f"{hw.name} ({hw.nodes} nodes x {hw.devices_per_node} {acc.name}{kernel})"
    return f"{hw.name} ({hw.devices_per_node} x {acc.name}{kernel})"


def layout_row(plan, times: str = "x") -> tuple[str, str]:
    """(label, value) of the plan table's SP row: the degree and, with a ring, its Ulysses x ring split."""
    c = plan.candidate
    gpus = f"(dp = {c.dp}, {c.sp * c.dp} GPUs)"
    if c.ring == 1:
        return "sequence parallel (Ulysses)", f"sp = {c.sp}   {gpus}"
    label = "sequence parallel (ring)" if c.ulysses == 1 else "sequence parallel (2-D)"
    return label, f"sp = {c.sp} = Ulysses {c.ulysses} {times} ring {c.ring}   {gpus}"


def sp_scope(plan) -> str:
    """On a multi-node cluster: may an SP group span nodes, and what the flag would change."""
    hw, c = plan.hardware, plan.candidate
    if plan.search.get("allow_cross_node_sp", False):
        where = "spans nodes" if c.sp > hw.devices_per_node else "within a node"
        return f"may span nodes; this one is {where}"
    excluded = plan.search.get("excluded_sp") or {}
    wider = sorted((int(sp) for sp in excluded if "span" in str(excluded[sp])), key=int)
    more = f"; sp {', '.join(map(str, wider))} would need SP groups spanning nodes (drop the flag)" if wider else ""
    return f"within a node of {hw.devices_per_node} GPUs (--no-cross-node-sp){more}"


def layout_why(plan) -> str:
    """Why the SP group is split this way, from the model's heads, the node size and the estimate's ring note
    ('' when there is nothing to explain: pure Ulysses inside a node)."""
    c, m, hw = plan.candidate, plan.model, plan.hardware
    per_node, u, r = hw.devices_per_node, c.ulysses, c.ring
    nodes = -(-c.sp // per_node)
    reasons = []
    if r == 1:
        if c.sp > per_node:
            reasons.append(f"pure Ulysses across {nodes} nodes: its all-to-alls use the inter-node network")
        return "; ".join(reasons)
    if c.sp > m.n_heads:
        reasons.append(f"Ulysses stops at the head count ({m.n_heads} query heads < sp = {c.sp}), the ring has no "
                       f"such limit")
    elif u > 1 and m.n_kv_heads < c.sp and u <= m.n_kv_heads:
        reasons.append(f"Ulysses {u} <= {m.n_kv_heads} KV heads needs no K/V copies (pure Ulysses would replicate "
                       f"each KV head {c.sp // m.n_kv_heads}x)")
    if u == 1:
        reasons.append("a pure ring has no all-to-alls and no all-to-all buffers")
    elif u <= per_node < c.sp:
        reasons.append(f"the all-to-alls stay inside a node ({u} of its {per_node} GPUs)")
    elif u > per_node:
        reasons.append(f"the Ulysses group spans {u // per_node} nodes")
    note = next((n for n in plan.estimate.notes if n.startswith("ring of")), "")
    hidden = re.search(r"\((\d+)% hidden", note)
    where = f"across {nodes} nodes" if c.sp > per_node else "inside the node"
    if hidden:
        reasons.append(f"the ring's P2P {where} is {hidden.group(1)}% hidden under blockwise attention")
    else:
        reasons.append(f"the ring runs {where}")
    return "; ".join(reasons)


def attention_line(att: dict | None, times: str = "x") -> str:
    """What packed documents and windows leave of the attention FLOPs ('' when neither applies)."""
    if not att:
        return ""
    what = []
    if att.get("documents"):
        what.append(f"documents of mean {format_tokens(round(att['mean_doc_len']))} tokens")
    if att.get("sliding_window"):
        layers = att.get("windowed_layers", 0)
        scope = "every layer" if layers == att.get("layers") else f"{layers} of {att.get('layers')} layers"
        what.append(f"a {att['sliding_window']:,}-token sliding window on {scope}")
    if not what:
        return ""
    pct = 100 * att["fraction"]
    shown = f"{pct:.2f}%" if pct < 1 else f"{pct:.1f}%"
    saved = att.get("triangle_flops", 0.0) - att.get("flops", 0.0)
    return (f"{shown} of the S{times}S causal triangle's FLOPs ({'; '.join(what)}): "
            f"{saved / 1e15:,.1f} PFLOP per step saved")


def expert_row(plan) -> str:
    """The plan's expert parallelism: degree, experts per GPU and where ZeRO shards the expert states."""
    c, m = plan.candidate, plan.model
    world = c.sp * c.dp
    active = f"{m.experts_per_token} of {m.n_experts} experts per token"
    if c.ep == 1:
        return f"ep = 1   (every GPU holds all {m.n_experts} experts; {active})"
    shard = f"ZeRO over the {world // c.ep} GPUs holding the same experts" if world > c.ep else "no ZeRO sharding left"
    return f"ep = {c.ep}   ({m.n_experts // c.ep} experts per GPU, {shard}; {active})"


def _count(n: int) -> str:
    """A parameter count as model cards write it, three significant figures: 8.03B, 46.7B, 494M, 558K."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        shown = f"{n / scale:.3g}"
        if float(shown) >= 1:  # after rounding: 999,999,999 is 1B, not 1e+03M
            return shown + unit
    return str(n)


def parameters_text(model) -> str:
    """The model's parameter count for the report's header, and for a mixture of experts the part one token
    uses (the plan JSON's ``parameters`` section)."""
    from autosp.contract.plan import parameter_counts

    counts = parameter_counts(model)
    total, active = counts["total"], counts["active_per_token"]
    return f"{_count(total)} parameters" + (f", {_count(active)} active per token" if active != total else "")


def render(plan, written: tuple[str, ...] = (), encoding: str | None = "utf-8") -> str:
    uni = _unicode_ok(encoding)
    dot = " · " if uni else " | "
    times = "×" if uni else "x"
    w, m = plan.workload, plan.model
    lines = []
    head = (f"autosp plan: {m.name} ({parameters_text(m)}) at {format_tokens(w.seq_len)} tokens ({w.seq_len:,}) "
            f"on {_hw_line(plan.hardware)}{dot}{w.dtype}{dot}objective {plan.objective}"
            + ("" if getattr(w, "compile_backend", "inductor") == "inductor" else f"{dot}compile backend {w.compile_backend}"))
    lines.append(head)
    if plan.objective == "max-ctx":
        lines.append(f"  longest trainable context: {w.seq_len:,} tokens (searched in steps of "
                     f"{plan.search.get('max_ctx_granule', 1024):,})")
    lines.append("")
    lines += _plan_lines(plan, times)
    lines += _memory_lines(plan, uni)
    lines += _prediction_lines(plan, dot, times)
    measured = plan.search.get("measured")
    if measured:
        lines.extend(_measured_lines(measured, plan.candidate))
    if plan.runner_ups:
        lines.append("Runner-ups (why they lost)")
        for i, r in enumerate(plan.runner_ups, 1):
            lines.append(f"  {i}. {r.candidate.short()}")
            lines.append(f"     {r.lost_because}")
        lines.append("")
    lines += _search_lines(plan, written)
    return "\n".join(lines) + "\n"


def _plan_lines(plan, times: str) -> list[str]:
    """The ``Plan`` section: one row per knob of the knob table, the layout's why, padding."""
    c, w, hw, m = plan.candidate, plan.workload, plan.hardware, plan.model
    lines = []
    sequences = c.micro_batch * c.grad_accum * c.dp
    lines.append("Plan")
    rows = []
    for knob in REPORT_ROWS:  # the knob table's rows, in its report order
        if knob.name == "sp":
            rows.append(layout_row(plan, times))
        elif knob.name == "micro_batch":
            rows.append((f"micro-batch {times} grad accum",
                         f"{c.micro_batch} {times} {c.grad_accum}   ({sequences} sequence"
                         f"{'s' if sequences != 1 else ''}, {sequences * w.seq_len:,} tokens per step)"))
        else:
            rows.append((knob.label, knob.describe(getattr(c, knob.name), c)))
    if getattr(m, "n_experts", 0):
        rows.insert(1, ("expert parallel", expert_row(plan)))
    why = layout_why(plan)
    if hw.nodes > 1:
        rows.insert(1, ("SP groups", sp_scope(plan)))
    for label, value in rows:
        lines.append(f"  {label:<30}{value}")
        if why and label.startswith("sequence parallel"):
            lines.extend(textwrap.wrap(why, width=98, initial_indent=f"  {'  why this split':<30}",
                                       subsequent_indent=" " * 32, break_on_hyphens=False))
    pad = plan.search.get("padding_tokens", 0)
    if pad:
        multiple = "sp" if c.ring == 1 else "sp and 2 x ring (zigzag ring chunks)"
        lines.append(f"  {'padding':<30}{pad:,} tokens ({100 * plan.search.get('padding_fraction', 0):.3f}%) to a "
                     f"multiple of {multiple}")
    lines.append("")
    return lines


def _memory_lines(plan, uni: bool) -> list[str]:
    """The ``Memory per GPU`` section: each term, its share of the usable memory, the headroom, host memory."""
    c, e, hw, m = plan.candidate, plan.estimate, plan.hardware, plan.model
    lines = []
    cap = e.capacity_bytes
    mem = e.memory
    lines.append(f"Memory per GPU (usable {format_gib(cap)} of {format_gib(hw.accelerator.memory_bytes)})")
    parts = [("parameters", mem.parameters), ("gradients", mem.gradients), ("optimizer states", mem.optimizer_states),
             ("activations", mem.activations), ("logits + loss", mem.logits_loss), ("comm buffers", mem.comm_buffers),
             ("allocator reserve", mem.reserve)]
    if getattr(m, "n_experts", 0):  # routed experts' weights, gradients and optimizer states, apart
        parts.insert(3, ("expert states", mem.expert_states))
    for label, value in parts + [("total", mem.total)]:
        frac = value / cap if cap else 0.0
        if label == "total":
            lines.append("  " + "-" * (30 + 10 + 8 + BAR_WIDTH))
        lines.append(f"  {label:<20}{value / GIB:>9,.2f} GiB {100 * frac:>6.1f}%  {bar(frac, unicode=uni)}")
    lines.append(f"  {'headroom':<20}{(cap - mem.total) / GIB:>9,.2f} GiB")
    if e.host_bytes > 0:
        per_node = e.host_bytes * min(hw.devices_per_node, c.sp * c.dp)
        lines.append(f"  {'host memory':<20}{e.host_bytes / GIB:>9,.2f} GiB per GPU, {per_node / GIB:,.0f} GiB per node "
                     f"(of {hw.host_memory_bytes / GIB:,.0f} GiB)")
    lines.append("")
    return lines


def _prediction_lines(plan, dot: str, times: str) -> list[str]:
    """The ``Prediction`` section: step time and its parts, communication, throughput, MFU, notes."""
    c, e, m = plan.candidate, plan.estimate, plan.model
    lines = []
    t = e.time
    lines.append("Prediction")
    lines.append(f"  {'step time':<20}{format_seconds(t.step)}   (compute {format_seconds(t.compute)}, of which "
                 f"recompute {format_seconds(t.recompute)}{dot}exposed comm {format_seconds(t.exposed_comm)}"
                 f"{dot}offload {format_seconds(t.offload)})")
    attention = "all-to-all" if c.ring == 1 else ("ring P2P" if c.ulysses == 1 else "all-to-all + ring P2P")
    experts = f"{dot}expert all-to-all {format_seconds(t.expert_comm)} (exposed)" if getattr(m, "n_experts", 0) else ""
    lines.append(f"  {'communication':<20}{attention} {format_seconds(t.attention_comm)}{dot}ZeRO "
                 f"{format_seconds(t.zero_comm)} (before overlap){experts}")
    per_gpu = e.tokens_per_second / max(1, c.sp * c.dp)
    lines.append(f"  {'throughput':<20}{e.tokens_per_second:,.0f} tokens/s ({per_gpu:,.0f} per GPU)")
    lines.append(f"  {'MFU':<20}{100 * e.mfu:.1f}%")
    share = attention_line(plan.search.get("attention"), times)
    if share:
        lines.extend(textwrap.wrap(share, width=98, initial_indent=f"  {'attention':<20}", subsequent_indent=" " * 22))
    for note in e.notes:
        lines.append(f"  note: {note}")
    profile = str(plan.search.get("model_profile", ""))
    if profile.startswith("analytic fallback"):
        lines.append(f"  note: {m.name} is priced with the analytic Llama-block formulas: {profile[len('analytic fallback'):].strip(' ()')}")
    lines.append("")
    return lines


def _search_lines(plan, written) -> list[str]:
    """How the plan was found (search, pins, shared study), the wall time, and the files written."""
    lines = []
    s = plan.search
    cache = s.get("cache", "off")
    if s.get("strategy") == "explain":
        where = "none: this configuration priced as given (autosp-plan explain)"
    elif cache == "hit":
        where = f"cached plan (from {s.get('cache_location', 'the plan cache')}; searched in " \
                f"{format_seconds(s.get('search_wall_time_s', 0.0))} when first asked)"
    else:
        trials = f"{s['trials']} trials, " if s.get("trials") else ""
        where = (f"{s.get('sampler', s.get('strategy', '?'))}: {trials}{s.get('evaluations', 0):,} cost-model "
                 f"evaluations, space of {s.get('space_size', 0):,} candidates (space {s.get('space_version', '?')})"
                 f"; cache {cache}")
    lines.append(f"Search   {where}")
    if s.get("fixed"):
        from autosp.planner.pins import format_pins

        pins = format_pins(sorted(s["fixed"].items()))
        lines.append(f"Given    {pins} (--fix)" if s.get("strategy") == "explain" else
                     f"Pinned   {pins} (--fix: the search kept these)")
    study = s.get("study")
    if study:
        lines.append(f"Study    {study.get('study_name')} in {study.get('storage')}: {study.get('trials_in_study')} "
                     f"trials from workers {', '.join(study.get('workers', []))} (this one: {study.get('worker')})")
    lines.append(f"Wall     {format_seconds(s.get('wall_time_s', 0.0))}{' (cached)' if cache == 'hit' else ''}")
    if written:
        lines.append(f"Wrote    {', '.join(written)}")
    return lines


def _measured_lines(measured: dict, chosen) -> list[str]:
    """The predicted-vs-measured table of ``--measure``."""
    from autosp.contract.specs import Candidate

    lines = [f"Measured (autosp-train, {measured.get('warmup_steps')} warm-up + {measured.get('steps')} steps, "
             f"backend {measured.get('backend')}; chosen by {measured.get('chosen_by')})"]
    from autosp.planner.cli.sweep_output import aligned

    cells, notes = [["#", "candidate", "pred s/step", "meas s/step", "pred tok/s", "meas tok/s", "pred mem",
                     "meas mem"]], {}
    for row in measured.get("results", []):
        p, m = row.get("predicted", {}), row.get("measured") or {}
        mark = "*" if Candidate(**row["candidate"]) == chosen else " "
        meas = ((f"{m['step_time_s']:.3f}", f"{m['tokens_per_second']:,.0f}",
                 f"{m['peak_memory_bytes'] / GIB:.2f} GiB") if m else ("-", "-", "-"))
        cells.append([f"{mark}{row['rank_predicted']:>2}", row["short"], f"{p.get('step_time_s', 0):.3f}", meas[0],
                      f"{p.get('tokens_per_second', 0):,.0f}", meas[1],
                      f"{p.get('peak_memory_bytes', 0) / GIB:.2f} GiB", meas[2]])
        if row.get("status") != "ok":
            notes[len(cells) - 1] = f"      {row.get('status')}"
    for i, line in enumerate(aligned(cells, right={0, 2, 3, 4, 5, 6, 7})):  # columns sized to the candidates
        lines.append(line)
        if i in notes:
            lines.append(notes[i])
    kind = next((r["measured"].get("memory_kind") for r in measured.get("results", []) if r.get("measured")), None)
    if kind:
        lines.append(f"  measured memory: peak {kind} of rank 0 (predicted: per-device peak)")
    if measured.get("note"):
        lines.append(f"  note: {measured['note']}")
    rejected = measured.get("rejected_knob_values") or {}
    if rejected:
        lines.append("  not measurable yet (autosp-train rejects): " + "; ".join(
            f"{k}={'/'.join(v)}" for k, v in rejected.items()))
    best = measured.get("cost_model_best")
    if best and not best.get("measurable", True):
        lines.append(f"  the cost model's best overall ({best['short']}, {best['tokens_per_second']:,.0f} tokens/s "
                     "predicted) cannot be measured yet")
    lines.append("")
    return lines


__all__ = ["BAR_WIDTH", "attention_line", "bar", "layout_row", "layout_why", "render", "sp_scope"]
