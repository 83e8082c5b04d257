"""Reliability diagrams as PNG files, drawn headless on matplotlib's Agg canvas.

The bins are those of ``cord_ops.metrics.ece`` (15 equal-width bins on the top-1
probability), so the drawn gaps are exactly the terms the logged ECE sums.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cord_ops import metrics
from cord_ops.atomic import atomic_path


def reliability_png(probs, labels, path, title: str) -> Path:
    """Draw the reliability diagram of ``probs`` against ``labels`` into ``path`` (PNG).

    Bars are per-bin accuracy, the outlined gap shows the mean confidence, the diagonal
    is perfect calibration and the bottom panel the share of rows in each bin. The
    figure is written to a temporary file beside ``path`` and moved into place, so a
    failure leaves no half-written image.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bins = metrics.reliability_diagram(probs, labels)
    edges, count = bins["edges"], bins["count"]
    centers = 0.5 * (edges[:-1] + edges[1:])
    width = np.diff(edges)
    filled = count > 0
    ece = metrics.ece(probs, labels)

    # A Figure on its own Agg canvas, without pyplot: matplotlib's process-wide backend is
    # never touched, and drawing is safe inside worker threads.
    fig = Figure(figsize=(4.2, 5.0), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="perfect")
    top.bar(centers[filled], bins["accuracy"][filled], width=width[filled], color="#4c72b0",
            edgecolor="white", label="accuracy")
    gap = bins["confidence"][filled] - bins["accuracy"][filled]
    top.bar(centers[filled], gap, bottom=bins["accuracy"][filled], width=width[filled],
            fill=False, edgecolor="#c44e52", hatch="//", label="gap to confidence")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.set_title(f"{title}  (ECE {ece:.4f})")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(centers, count / count.sum(), width=width, color="0.4")
    bottom.set_xlabel("top-1 probability")
    bottom.set_ylabel("share")
    # Fixed margins for this fixed figure size: tight_layout would measure every text
    # extent first, a third of the drawing time, to arrive at about these numbers.
    fig.subplots_adjust(left=0.15, right=0.97, top=0.94, bottom=0.09, hspace=0.08)

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)
