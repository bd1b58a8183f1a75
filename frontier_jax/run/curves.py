"""curves.png: what a run's metrics.jsonl says, drawn so that it cannot mislead (no JAX; matplotlib).

The periodic validations (on at most `train.val_max_tokens` tokens, a subset), the final validation (the
full val split), the artifact's round trip and its sliding windows (the full split again, on the artifact's
weights) are separate series with their token counts in the legend, never one line: a subset and the full split are
different measurements. Every point is marked, so a run of a few steps is readable; the figure is
titled with the run's name.
"""

from __future__ import annotations

import io
from pathlib import Path

from frontier_jax.data.files import atomic_write


def curve_series(rows: list[dict]) -> dict[str, dict]:
    """The series curves.png draws, from metrics.jsonl rows: "train" (loss per step), "val_periodic" (the
    periodic validations, on at most train.val_max_tokens tokens), "val_final" (the final validation,
    the full val split), "roundtrip" and, when the run has it, "sliding" (the artifact's full-split scores).
    Each: label, panel ("loss" or "bpb"), and the points' train_seconds, tokens and values."""
    def series(sel, key, label, panel):
        return {"label": label, "panel": panel, "train_seconds": [r["train_seconds"] for r in sel],
                "tokens": [r["tokens"] for r in sel], "y": [r[key] for r in sel]}

    train = [r for r in rows if r.get("kind") == "train"]
    periodic = [r for r in rows if r.get("kind") == "val" and not r.get("final")]
    final = [r for r in rows if r.get("kind") == "val" and r.get("final")]
    rt = [r for r in rows if r.get("kind") == "roundtrip"]
    sliding = [r for r in rows if r.get("kind") == "sliding"]

    def tokens_of(sel):
        n = sorted({r.get("val_tokens") for r in sel if r.get("val_tokens")})
        return f"{n[-1]:,} tokens" if n else "tokens ?"

    return {"train": series(train, "loss", "train loss", "loss"),
            "val_periodic": series(periodic, "bpb", f"periodic val (subset: {tokens_of(periodic)})", "bpb"),
            "val_final": series(final, "bpb", f"final val (full split: {tokens_of(final)})", "bpb"),
            "roundtrip": series(rt, "bpb", "artifact round trip (full split)", "bpb"),
            **({"sliding": series(sliding, "bpb", "artifact, sliding windows (full split)", "bpb")} if sliding else {})}


def plot_run(rows: list[dict], path: Path, title: str = "") -> None:
    """PNG: train loss and val bpb (periodic, final, round trip: separate series) against training time
    and tokens, titled with the run's name; every point marked, so a run of a few steps stays readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = curve_series(rows)
    styles = {"train": dict(lw=0.8), "val_periodic": dict(marker="o", ls="-", ms=4),
              "val_final": dict(marker="*", ls="none", ms=12), "roundtrip": dict(marker="x", ls="none", ms=9),
              "sliding": dict(marker="+", ls="none", ms=11)}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for col, xkey, xlabel in ((0, "train_seconds", "training time (s)"), (1, "tokens", "tokens")):
        for row, panel, ylabel in ((0, "loss", "train loss (nats/token)"), (1, "bpb", "val bits/byte")):
            ax = axes[row][col]
            for name, ser in series.items():
                if ser["panel"] != panel or not ser["y"]:
                    continue
                style = dict(styles[name])
                if name == "train" and len(ser["y"]) <= 50:
                    style.update(marker=".", ms=5)
                ax.plot(ser[xkey], ser["y"], label=ser["label"], **style)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.margins(0.05, 0.15)  # a point at the edge of the data (a run's last validations) stays visible
            right = max((max(v[xkey]) for v in series.values() if v["panel"] == panel and v[xkey]), default=0)
            ax.set_xlim(0, 1.05 * right or 1.0)
            if ax.lines:
                ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write(path, [buf.getvalue()])  # renamed into place: never written through a symlink
