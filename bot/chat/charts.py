"""The loss-curve PNG posted into a job's thread (matplotlib's Agg canvas, imported only when drawn)."""

from __future__ import annotations

from pathlib import Path


def loss_chart(losses: list[tuple[int, float]], path: Path, *, title: str = "training loss") -> Path:
    """Draw loss against step to ``path`` (PNG) and return it; thread-safe (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    points = sorted((int(s), float(v)) for s, v in losses if v == v)  # drop NaN
    if points:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, color="#1f77b4", linewidth=1.6, marker="." if len(points) < 60 else None)
    ax.set_title(title[:80])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
