"""How a benchmark reports: a table on stdout, the rows as JSON, and (with matplotlib
installed) the same numbers as a grouped bar chart in PNG, side by side with the JSON.

    report(rows, "prefix_cache", Chart("server", ["cold ms", "warm ms"], "TTFT (ms)"))

writes ``bench/results/prefix_cache.json`` and ``.png`` (or under ``$BENCH_OUT``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

Row = dict[str, object]


@dataclass(frozen=True)
class Chart:
    label: str  # the row field naming each group of bars (x axis)
    values: list[str]  # row fields drawn as bars, one colour each
    ylabel: str
    title: str = ""
    log: bool = False  # a log y axis, for values orders of magnitude apart


def print_table(rows: list[Row]) -> None:
    if not rows:
        return
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    print("  ".join(k.rjust(widths[k]) for k in keys))
    for r in rows:
        print("  ".join(str(r.get(k, "")).rjust(widths[k]) for k in keys))


def out_dir() -> Path:
    """Where results go (made if missing: bench/results/ is not in git)."""
    path = Path(os.environ.get("BENCH_OUT", Path(__file__).resolve().parent / "results"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_chart(rows: list[Row], chart: Chart, path: Path) -> bool:
    """The rows as grouped bars; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no chart: pip install matplotlib)", file=sys.stderr)
        return False
    series = [v for v in chart.values if any(isinstance(r.get(v), (int, float)) for r in rows)]
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(rows) * max(1, len(series)) / 2, 3.6),
                           dpi=110)
    for i, name in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        ys = [float(r[name]) if isinstance(r.get(name), (int, float)) else 0.0  # type: ignore[arg-type]
              for r in rows]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=[f"{y:g}" for y in ys], fontsize=7, padding=1)
    ax.set_xticks(range(len(rows)), [str(r.get(chart.label)) for r in rows])
    ax.set_xlabel(chart.label)
    ax.set_ylabel(chart.ylabel)
    if chart.log:
        ax.set_yscale("log")
    if chart.title:
        ax.set_title(chart.title, fontsize=10)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def report(rows: list[Row], name: str, chart: Chart | None = None) -> None:
    """Print the table; write ``<name>.json`` (and ``<name>.png`` for a chart)."""
    print_table(rows)
    target = out_dir() / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(rows, indent=2) + "\n")
    written = [target]
    if chart is not None and save_chart(rows, chart, target.with_suffix(".png")):
        written.append(target.with_suffix(".png"))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
