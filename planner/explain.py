"""Why each runner-up lost: the alternatives a plan shows next to the winner, each with the component of
the step (or the memory) that made it lose and the knobs it differs in."""

from __future__ import annotations

import math

from autosp.contract.knobs import KNOBS, family_of, knobs_of
from autosp.contract.specs import Candidate, Estimate
from autosp.contract.plan import RunnerUp
from autosp.planner.shortfall import memory_shortfall
from autosp.units import format_gib, format_seconds, format_tokens


def _group(cand: Candidate) -> tuple:
    return family_of(cand)


def differences(cand: Candidate, best: Candidate) -> str:
    out = []
    for knob in KNOBS:  # the table's short names; knobs without one are not compared
        if not knob.short:
            continue
        label = knob.short
        a, b = getattr(cand, knob.name), getattr(best, knob.name)
        if a != b:
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            out.append(f"{label} {a} vs {b}")
    return ", ".join(out)


def _slower_because(cand: Candidate, est: Estimate, best: Candidate, best_est: Estimate) -> str:
    """Which component of the step makes ``cand`` slower than ``best``, per token trained."""
    def per_token(e: Estimate) -> dict:
        tokens = e.tokens_per_second * e.time.step
        if tokens <= 0:
            return {}
        t = e.time
        return {"compute": (t.compute - t.recompute) / tokens, "recompute": t.recompute / tokens,
                "exposed communication": t.exposed_comm / tokens, "activation offload": t.offload / tokens}

    a, b = per_token(est), per_token(best_est)
    if not a or not b:
        return "slower"
    deltas = {k: a[k] - b[k] for k in a}
    worst = max(deltas, key=deltas.get)
    if deltas[worst] <= 0:
        return "slower overall"
    best_tokens = best_est.tokens_per_second * best_est.time.step
    return f"more {worst} (+{format_seconds(deltas[worst] * best_tokens)} per step)"


def lost_because(cand: Candidate, est: Estimate, best: Candidate, best_est: Estimate, seq_len: int,
                 max_ctx: int | None = None) -> str:
    diff = differences(cand, best)
    if not est.fits:
        text = (f"does not fit: needs {format_gib(est.memory.total)} > {format_gib(est.capacity_bytes)} "
                f"per GPU at {format_tokens(seq_len)} tokens" if math.isfinite(est.memory.total) else
                f"does not fit at {format_tokens(seq_len)} tokens: {memory_shortfall(est)}")
        if est.tokens_per_second > best_est.tokens_per_second:
            pct = 100 * (est.tokens_per_second / best_est.tokens_per_second - 1)
            text = f"would be {pct:.1f}% faster but " + text
        if max_ctx:
            text += f" (its longest context: {format_tokens(max_ctx)})"
        return f"{text} [{diff}]"
    ratio = est.tokens_per_second / best_est.tokens_per_second
    if ratio >= 0.9995:
        return f"same predicted speed; the winner is simpler or leaner [{diff}]"
    return f"{100 * (1 - ratio):.1f}% slower: {_slower_because(cand, est, best, best_est)} [{diff}]"


def explain_runner_ups(result, evaluator, objective: str, top_k: int) -> list[RunnerUp]:
    """Up to ``top_k`` alternatives that teach something: the fastest candidate that does not fit (if it
    beats the winner), then the best of each other (sp, ring, ZeRO stage, checkpointing) family."""
    if top_k <= 0 or not result.ranked:
        return []
    best, best_est = result.ranked[0]
    chosen: list[tuple[Candidate, Estimate]] = []
    if objective == "throughput":
        too_big = [(c, e) for c, e in result.ranked if not e.fits]
        if too_big:
            fastest = max(too_big, key=lambda item: item[1].tokens_per_second)
            if fastest[1].tokens_per_second > best_est.tokens_per_second:
                chosen.append(fastest)
    groups = {_group(best)} | {_group(c) for c, _ in chosen}
    for cand, est in result.ranked[1:]:
        if len(chosen) >= top_k:
            break
        if _group(cand) in groups:
            continue
        groups.add(_group(cand))
        chosen.append((cand, est))
    out = []
    for cand, est in chosen[:top_k]:
        max_ctx = None
        if objective == "max-ctx" and not est.fits:
            knobs = knobs_of(cand, evaluator.space.KNOBS)
            max_ctx = evaluator.max_context(evaluator.space.make(**dict(knobs, micro_batch=1)))
        out.append(RunnerUp(cand, est, lost_because(cand, est, best, best_est, result.seq_len, max_ctx)))
    return out


__all__ = ["differences", "explain_runner_ups", "lost_because"]
