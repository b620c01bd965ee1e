"""The report's plot: each compared tensor's error against its tolerance, log-log, one color per build.

Protocol: :func:`scatter_png` takes a metrics frame
(:func:`harness.results.frames.metrics_frame`) and an implementation and
returns PNG bytes (matplotlib, Agg), or None when nothing can be plotted;
:func:`plottable` keeps the tensors a log-log plot can show.
"""

from __future__ import annotations

import io
from typing import Optional


def plottable(metrics):
    """The tensors a log-log plot can show: finite error, finite positive tolerance."""
    import numpy as np

    return metrics[np.isfinite(metrics["tol"]) & (metrics["tol"] > 0) & np.isfinite(metrics["max_abs_err"])]


def scatter_png(metrics, impl: str) -> Optional[bytes]:
    """PNG of max_abs_err against tol per tensor (log-log) for one implementation, or None without data."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    sub = plottable(metrics[metrics["impl"] == impl])
    if sub.empty:
        return None
    positive = sub["max_abs_err"] > 0
    floor = sub.loc[positive, "max_abs_err"].min() / 10 if positive.any() else sub["tol"].min() * 1e-6
    fig, ax = plt.subplots(figsize=(7, 5), dpi=96)
    for i, (build, g) in enumerate(sorted(sub.groupby("build"), key=lambda kv: kv[0])):
        err = g["max_abs_err"].where(g["max_abs_err"] > 0, floor)
        ax.scatter(g["tol"], err, s=9, alpha=0.6, label=f"{build} ({len(g)})", color=f"C{i}", linewidths=0)
        bad = ~g["ok"]
        if bad.any():
            ax.scatter(g.loc[bad, "tol"], g.loc[bad, "max_abs_err"], s=40, facecolors="none", edgecolors="red",
                       linewidths=1.0)
    lo = min(sub["tol"].min(), floor)
    hi = max(sub["tol"].max(), sub["max_abs_err"].max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="err = tol")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tolerance at the worst element (largest err/tol)")
    ax.set_ylabel("max abs error (exact zeros drawn at the bottom)")
    ax.set_title(f"{impl}: error against tolerance per tensor")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
