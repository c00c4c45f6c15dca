"""The human-readable reports of ``autosp-plan check`` and ``select`` (``--json`` prints the result
dicts of :mod:`autosp.planner.check` as they are)."""

from __future__ import annotations

from autosp.planner.check import PASS
from autosp.planner.cli.sweep_output import aligned


def _gib_or_host(nbytes: float, fmt: str = ",.1f") -> str:
    """GiB, or what an infinite total means (offloads beyond host memory; the reasons say how much)."""
    from autosp.units import GIB

    return f"{nbytes / GIB:{fmt}} GiB" if nbytes != float("inf") else "host memory short"


def render_check(r: dict) -> str:
    from autosp.units import GIB

    t = r["target"]
    lines = [f"autosp-plan check {r['file']}: {r['status'].upper()} (exit {r['exit_code']})",
             f"  {'plan':<10}{r['short']}  ({r['kind']})",
             f"  {'target':<10}{t['model']} at {t['workload']['seq_len']:,} tokens on {t['hardware']} "
             f"({t['workload']['dtype']}, objective {t['objective']})"]
    now = r["now"]
    if not now["valid"]:
        lines.append(f"  {'valid':<10}no: {now['invalid_reason']}")
    else:
        if now["memory_bytes"] == float("inf"):
            lines.append(f"  {'memory':<10}DOES NOT FIT: its offloads need more host memory than the node has (why: below)")
        else:
            lines.append(f"  {'memory':<10}{now['memory_bytes'] / GIB:,.1f} GiB of {now['capacity_bytes'] / GIB:,.1f} GiB "
                         f"usable per GPU: {'fits' if now['fits'] else 'DOES NOT FIT'}")
        speed = f"{now['tokens_per_second']:,.0f} tokens/s predicted now"
        if r["committed"]:
            speed += f" (committed: {r['committed']['tokens_per_second']:,.0f})"
        if r["best"] and t["objective"] == "max-ctx":
            speed += (f"; longest context found now {r['best']['seq_len']:,} tokens ({r['best']['short']}), "
                      f"committed {t['workload']['seq_len']:,}")
        elif r["best"]:
            speed += f"; best found now {r['best']['tokens_per_second']:,.0f} ({r['best']['short']})"
        lines.append(f"  {'speed':<10}{speed}")
        if r["gap"] is not None:
            lines.append(f"  {'gap':<10}{100 * r['gap']:.2f}% behind the best (tolerance {100 * r['tolerance']:.1f}%)")
    for label, items in (("changed", r["changes"]), ("why", r["reasons"]), ("note", r["notes"])):
        for i, item in enumerate(items):
            lines.append(f"  {label if i == 0 else '':<10}{item}")
    if r["exit_code"] != PASS:
        lines.append(f"  {'re-plan':<10}{r['replan']}")
    if r.get("best_out"):
        lines.append(f"  {'wrote':<10}{r['best_out']} (the best plan found now)")
    return "\n".join(lines) + "\n"


def render_select(r: dict) -> str:
    from autosp.units import GIB

    t = r["target"]
    lines = [f"autosp-plan select: {r['status'].upper()} (exit {r['exit_code']}) for {t['model']} at "
             f"{t['workload']['seq_len']:,} tokens on {t['hardware']}"]
    cells = [["", "file", "candidate", "tokens/s", "memory", "status"]]
    chosen = (r["selected"] or {}).get("file")
    for row in r["candidates"]:
        if not row["valid"]:
            state, tps, mem = f"invalid: {row['invalid_reason']}", "-", "-"
        else:
            state = "fits" if row["fits"] else "does not fit"
            tps, mem = f"{row['tokens_per_second']:,.0f}", _gib_or_host(row["memory_bytes"], ".1f")
        if row["made_for_another_target"]:
            state += " (made for another target)"
        cells.append(["*" if row["file"] == chosen else " ", row["file"], row["short"], tps, mem, state])
    lines += ["  " + line for line in aligned(cells, right={3, 4}, gap=2)]
    if r["best"]:
        lines.append(f"  best found now: {r['best']['short']} {r['best']['tokens_per_second']:,.0f} tokens/s "
                     f"(selected is {100 * r['gap']:.2f}% behind, tolerance {100 * r['tolerance']:.1f}%)")
    for reason in r["reasons"]:
        lines.append(f"  why: {reason}")
    if r["written"]:
        lines.append(f"  wrote {', '.join(r['written'])}")
    return "\n".join(lines) + "\n"


__all__ = ["render_check", "render_select"]
