"""What ``autosp-plan sweep`` prints and draws: the table, CSV, JSON, and the PNG plot (matplotlib, the
[plot] extra; written atomically through :func:`autosp.files.write_bytes`)."""

from __future__ import annotations

import csv
import io
import json

from autosp.errors import UsageError
from autosp.messages import install_hint
from autosp.planner.sweep import COLUMNS
from autosp.units import format_seconds, format_tokens


def aligned(rows: list[list[str]], right=frozenset(), gap: int = 2) -> list[str]:
    """Rows of cells as lines: each column as wide as its widest cell, columns ``gap`` spaces apart (right-aligned
    where their index is in ``right``), so no cell runs into the next however long a model path is. A row with
    fewer cells ends in a free-text cell (a status message) that sets no width."""
    n = max(len(r) for r in rows)
    full = [r for r in rows if len(r) == n]
    widths = [max(len(r[i]) for r in full) for i in range(n)]
    lines = []
    for r in rows:
        last = len(r) - 1 if len(r) < n else None
        cells = [c if i == last else c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                 for i, c in enumerate(r)]
        lines.append((" " * gap).join(cells).rstrip())
    return lines


def table(rows: list[dict], wall_s: float) -> str:
    max_ctx = any(r["objective"] == "max-ctx" for r in rows)
    cells = [["model", "hardware", "GPUs", "longest ctx" if max_ctx else "context", "tokens/s", "per GPU", "MFU",
              "step", "mem/GPU", "plan"]]
    for r in rows:
        ctx = r["ctx"] if r["ctx"] is not None else r["ctx_asked"]
        first = [str(r["model"]), str(r["hardware"]), str(r["gpus"]), format_tokens(ctx) if ctx else "-"]
        if r["status"] != "ok":
            cells.append(first + [f"{r['status']}: {r['message']}"])
            continue
        cells.append(first + [f"{r['tokens_per_second']:,.0f}", f"{r['tokens_per_second_per_gpu']:,.0f}",
                              f"{100 * r['mfu']:.1f}%", format_seconds(r["step_time_s"]),
                              f"{r['memory_gib']:.1f} GiB", r["plan"]])
    body = aligned(cells, right={2, 3, 4, 5, 6, 7, 8})
    lines = [body[0], "-" * len(body[0]), *body[1:]]
    ok = sum(r["status"] == "ok" for r in rows)
    cached = sum(r.get("cache") == "hit" for r in rows)
    searches = sorted({r["search"] for r in rows if r.get("search")})
    lines.append("")
    lines.append(f"{len(rows)} requests ({ok} planned, {len(rows) - ok} without a plan; {cached} from the plan cache) "
                 f"in {format_seconds(wall_s)}; search: {', '.join(searches) or '-'}; every figure is the cost model's "
                 f"prediction")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def to_json(rows: list[dict], wall_s: float, settings: dict) -> str:
    return json.dumps({"settings": settings, "wall_s": round(wall_s, 3), "rows": rows}, indent=2) + "\n"


def require_matplotlib(flag: str = "--plot"):
    """matplotlib's pyplot on the Agg backend, or a one-line UsageError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"{flag} needs matplotlib: {install_hint('plot')} (or leave out {flag})") from None
    return plt


def plot_png(rows: list[dict]) -> bytes:
    """The sweep as a PNG: longest context against GPU count (max-ctx), else tokens/s against context; one line
    per model (and accelerator, or cluster)."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ok = [r for r in rows if r["status"] == "ok"]
    if any(r["objective"] == "max-ctx" for r in rows):
        series = {}
        for r in ok:
            series.setdefault(f"{r['model']} ({r['accelerator']})", []).append((r["gpus"], r["ctx"]))
        for label, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            for x, y in points:
                ax.annotate(format_tokens(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("longest trainable context (tokens)")
        ax.set_title("Longest context that fits, predicted by autosp-plan")
        gpus = sorted({r["gpus"] for r in rows})
        ax.set_xticks(gpus, [str(g) for g in gpus])
    else:
        series = {}
        for r in ok:
            series.setdefault(f"{r['model']} on {r['hardware']}", []).append((r["ctx"], r["tokens_per_second"]))
        for label, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        contexts = sorted({r["ctx"] for r in ok})
        if contexts:
            ax.set_xticks(contexts, [format_tokens(c) for c in contexts])
            ax.minorticks_off()
        ax.set_xlabel("context (tokens per sequence)")
        ax.set_ylabel("tokens/s (whole cluster)")
        ax.set_title("Predicted training throughput of the best plan")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if ok:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no request has a plan", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


__all__ = ["aligned", "plot_png", "require_matplotlib", "table", "to_csv", "to_json"]
