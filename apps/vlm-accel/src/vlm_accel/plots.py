"""Figures of `vlm-accel` results. matplotlib is imported when a figure is drawn."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

_BAR = "#2a6f97"
_BASE = "#9aa5b1"


def _check_rows(rows: Sequence[Mapping], baseline: str) -> None:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"rows: expected a non-empty list of dicts, got {rows!r}")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise TypeError(f"rows[{i}]: expected a dict, got {type(r).__name__}")
        missing = {"method", "tokens", "ttft_s", "ttft_runs_s"} - set(r)
        if missing:
            raise ValueError(
                f"rows[{i}]: expected keys method, tokens, ttft_s, ttft_runs_s; missing "
                f"{sorted(missing)} in {sorted(r)}"
            )
        runs = r["ttft_runs_s"]
        if isinstance(runs, (str, bytes)) or not isinstance(runs, Sequence) or not runs:
            raise ValueError(
                f"rows[{i}]['ttft_runs_s']: expected a non-empty list of seconds, got {runs!r}"
            )
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in runs):
            raise ValueError(
                f"rows[{i}]['ttft_runs_s']: expected finite positive seconds, got {list(runs)}"
            )
        if not min(runs) <= r["ttft_s"] <= max(runs):
            raise ValueError(
                f"rows[{i}]['ttft_s']: expected a value within its runs "
                f"[{min(runs)}, {max(runs)}], got {r['ttft_s']}"
            )
    methods = [r["method"] for r in rows]
    if len(set(methods)) != len(methods):
        raise ValueError(f"rows: expected each method once, got {methods}")
    if baseline not in methods:
        raise ValueError(f"baseline: expected one of the rows' methods {methods}, got {baseline!r}")
    tokens = {r["tokens"] for r in rows}
    if len(tokens) != 1:
        raise ValueError(f"rows: expected one prompt length for all rows, got tokens {tokens}")


def bench_figure(
    rows: Sequence[Mapping],
    *,
    device: str,
    baseline: str = "dense",
    title: str | None = None,
):
    """A matplotlib ``Figure`` of time to first token per method: one horizontal bar per row at
    its ``ttft_s``, whiskers from the fastest to the slowest of its ``ttft_runs_s``, and the
    speed-up over the ``baseline`` row (its ``ttft_s`` / the row's) written on each bar.

    ``rows``: dicts with ``method`` (str, each once), ``tokens`` (prompt length, the same for
    every row), ``ttft_s`` (the median of the runs, the figure reported) and ``ttft_runs_s`` (the time
    of every timed repeat, seconds); ``top1_agrees_with_first`` (bool), where present, marks a
    row whose next token differs from the first row's. ``device``: the device's name, shown in
    the title.
    """
    _check_rows(rows, baseline)
    if not isinstance(device, str) or not device:
        raise ValueError(f"device: expected the device's name, got {device!r}")
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover
        raise ImportError("bench_figure needs matplotlib: pip install matplotlib") from e
    slowest = max(max(r["ttft_runs_s"]) for r in rows)
    unit, mult = ("s", 1.0) if slowest >= 1.0 else ("ms", 1e3)
    base = next(r["ttft_s"] for r in rows if r["method"] == baseline)
    n_runs = sorted({len(r["ttft_runs_s"]) for r in rows})
    fig = Figure(figsize=(8, 1.6 + 0.55 * len(rows)), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(rows)))
    mid = [r["ttft_s"] * mult for r in rows]
    lo = [(r["ttft_s"] - min(r["ttft_runs_s"])) * mult for r in rows]
    hi = [(max(r["ttft_runs_s"]) - r["ttft_s"]) * mult for r in rows]
    colors = [_BASE if r["method"] == baseline else _BAR for r in rows]
    ax.barh(y, mid, color=colors, height=0.6, xerr=[lo, hi], capsize=4, ecolor="black")
    labels = []
    for yi, r, m, h in zip(y, rows, mid, hi):
        speed = "baseline" if r["method"] == baseline else f"{base / r['ttft_s']:.2f}x"
        ax.text(
            m + h + 0.01 * slowest * mult,
            yi,
            f"{m:.3g} {unit}  {speed}",
            va="center",
            fontsize=9,
            fontweight="bold" if r["method"] != baseline else "normal",
        )
        differs = r.get("top1_agrees_with_first") is False
        labels.append(r["method"] + ("\n(next token differs)" if differs else ""))
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, slowest * mult * 1.3)
    runs = "/".join(str(n) for n in n_runs)
    ax.set_xlabel(f"time to first token ({unit}); bar: median, whiskers: min-max of {runs} repeats")
    ax.set_ylabel("method")
    tokens = rows[0]["tokens"]
    head = title or f"Prefill time to first token, {tokens} tokens"
    fig.suptitle(f"{head}\n{device}; speed-up over {baseline} written on each bar", fontsize=11)
    return fig
