"""Plots of dspark results with matplotlib.

Every function takes the data as dspark returns it, draws on `ax` (a new
figure when None), saves a PNG when `path` is given and returns the Figure.

    acceptance_by_position(result)   a generate()/bench() result, or the list
    speedup_per_prompt(bench_result) dspark.bench(...) output
    reliability(report)              dspark.sts_report(...) output
    sps_curve(profile)               a `dspark profile` JSON (dict or path)
"""

from __future__ import annotations

import json
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def _axes(ax, size=(6.0, 4.0)):
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=size, dpi=100)
    return fig, ax


def _finish(fig, path):
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, format="png")
    return fig


def _acceptance(data) -> list[float]:
    if isinstance(data, dict):
        for key in ("dspark", "aggregate"):
            if key in data:
                return _acceptance(data[key])
        return list(data.get("acceptance_by_position") or [])
    return list(data)


def acceptance_by_position(data, path: str | None = None, ax=None, label: str | None = None):
    """Bar chart of the conditional acceptance rate per draft position:
    P(position k accepted | positions before it accepted)."""
    acc = _acceptance(data)
    if not acc:
        raise ValueError("no acceptance_by_position in the data (plain decoding has none)")
    fig, ax = _axes(ax)
    ks = list(range(1, len(acc) + 1))
    ax.bar(ks, acc, color="tab:blue", label=label)
    for k, a in zip(ks, acc):
        ax.text(k, a + 0.01, f"{a:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(ks)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("acceptance rate")
    ax.set_title("Acceptance by position")
    ax.grid(axis="y", alpha=0.3)
    return _finish(fig, path)


def speedup_per_prompt(bench_result: dict, path: str | None = None, ax=None):
    """Speculative over plain decode speed per prompt of a bench() result,
    with the aggregate speedup as a dashed line and tau above each bar."""
    rows = [r for r in bench_result.get("prompts", []) if "speedup" in r]
    if not rows:
        raise ValueError("the bench result has no per-prompt speedup (was a drafter used?)")
    fig, ax = _axes(ax, size=(max(6.0, 0.5 * len(rows) + 2), 4.0))
    ids = [str(r["id"]) for r in rows]
    speedups = [r["speedup"] for r in rows]
    colors = ["tab:green" if s >= 1 else "tab:red" for s in speedups]
    ax.bar(range(len(rows)), speedups, color=colors)
    for i, r in enumerate(rows):
        ax.text(i, r["speedup"], f"τ {r.get('tau', 0):.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    agg = bench_result.get("aggregate", {}).get("speedup")
    if agg:
        ax.axhline(agg, color="tab:blue", linestyle="--", label=f"aggregate {agg:.2f}x")
        ax.legend(loc="lower right")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(ids, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("speedup (spec / plain decode tok/s)")
    ax.set_title("Speedup per prompt")
    return _finish(fig, path)


def reliability(report: dict, path: str | None = None):
    """Reliability diagrams before and after STS calibration: per draft
    position, observed prefix survival against the predicted survival of
    each non-empty bin; the diagonal is perfect calibration."""
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.6), dpi=100, sharey=True)
    cmap = plt.get_cmap("tab10")
    for ax, key, ece_key, title in ((axes[0], "bins_before", "ece_before", "before STS"),
                                    (axes[1], "bins_after", "ece_after", "after STS")):
        ax.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1)
        for k, bins in enumerate(report[key]):
            pts = [(b["mean_prob"], b["frequency"]) for b in bins if b["count"] > 0]
            if not pts:
                continue
            ece = report.get(ece_key, [None] * (k + 1))[k]
            label = f"k={k + 1}" + (f" (ECE {ece:.3f})" if isinstance(ece, (int, float)) else "")
            ax.plot([p for p, _ in pts], [f for _, f in pts], marker="o", markersize=3, color=cmap(k % 10),
                    label=label)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_xlabel("predicted survival")
        ax.set_title(title)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("observed survival")
    return _finish(fig, path)


def sps_curve(profile, path: str | None = None, ax=None):
    """SPS(B): target forward steps per second against B verify tokens, and
    the tokens per second B·SPS(B) it could carry."""
    if isinstance(profile, str):
        with open(profile, encoding="utf-8") as f:
            profile = json.load(f)
    sps: Sequence[float] = profile["sps"]
    bs = profile.get("b") or list(range(1, len(sps) + 1))
    fig, ax = _axes(ax)
    ax.plot(bs, sps, marker="o", color="tab:blue", label="SPS(B) steps/s")
    if len(bs) <= 32:
        ax.set_xticks(bs)
    ax.set_xlabel("B (verify tokens per step)")
    ax.set_ylabel("target steps per second", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(bs, [b * s for b, s in zip(bs, sps)], marker="s", color="tab:orange", label="B·SPS(B) tokens/s")
    ax2.set_ylabel("verified tokens per second", color="tab:orange")
    title = "SPS profile"
    if profile.get("model"):
        title += f": {profile['model']}"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return _finish(fig, path)
