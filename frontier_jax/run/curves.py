"""curves.png: what a run's metrics.jsonl says, drawn so that it cannot mislead (no JAX; matplotlib).

The periodic validations (on at most `train.val_max_tokens` tokens, a subset), the final validation (the
full val split), the artifact's round trip, its sliding windows and its test-time training (the full split again,
from the artifact's weights) are separate series with their token counts in the legend, never one line: a subset
and the full split are different measurements (a periodic validation that covered the whole split, as in the demo,
says so). Every point is marked, so a run of a few steps is readable; token counts read 200k, 1.5M; values are
plain (no offset such as "+2.86" above the axis). The figure is titled with the run's name and the settings in
which it differs from its config file (`overrides`: `--set`, `--budget`, `--seed`; the data paths left out).
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

from frontier_jax.data.files import atomic_write
from frontier_jax.config import ConfigError, load_config, load_run_config, to_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def overrides(run_config: dict, base_config: dict) -> list[str]:
    """`key=value` for every setting of `run_config` (to_dict of a Config) that differs from `base_config`'s,
    in field order; the data section (paths) and the name left out."""
    out = []

    def walk(a, b, prefix):
        for k, v in a.items():
            key = f"{prefix}{k}"
            if key in ("name", "data") or key.startswith("data."):
                continue
            if isinstance(v, dict):
                walk(v, b.get(k, {}), key + ".")
            elif b.get(k) != v:
                out.append(f"{key}={v!r}" if isinstance(v, str) else f"{key}={v}")

    walk(run_config, base_config, "")
    return out


def run_overrides(run_dir: Path, config_name: str | None) -> list[str]:
    """What a run changed from configs/<config_name>.py (its config.json against the file), [] when either is
    missing or unreadable (a config from elsewhere has no file to differ from)."""
    path = CONFIGS / f"{config_name}.py"
    try:
        return overrides(to_dict(load_run_config(Path(run_dir) / "config.json")), to_dict(load_config(path)))
    except (ConfigError, OSError):
        return []


def curve_series(rows: list[dict]) -> dict[str, dict]:
    """The series curves.png draws, from metrics.jsonl rows: "train" (loss per step), "val_periodic" (the
    periodic validations, on at most train.val_max_tokens tokens), "val_final" (the final validation,
    the full val split), "roundtrip" and, when the run has them, "sliding" and "ttt" (the artifact's full-split
    scores).
    Each: label, panel ("loss" or "bpb"), and the points' train_seconds, tokens and values."""
    def series(sel, key, label, panel):
        return {"label": label, "panel": panel, "train_seconds": [r["train_seconds"] for r in sel],
                "tokens": [r["tokens"] for r in sel], "y": [r[key] for r in sel]}

    train = [r for r in rows if r.get("kind") == "train"]
    periodic = [r for r in rows if r.get("kind") == "val" and not r.get("final")]
    final = [r for r in rows if r.get("kind") == "val" and r.get("final")]
    rt = [r for r in rows if r.get("kind") == "roundtrip"]
    sliding = [r for r in rows if r.get("kind") == "sliding"]
    ttt = [r for r in rows if r.get("kind") == "ttt"]

    def count(sel):
        n = sorted({r.get("val_tokens") for r in sel if r.get("val_tokens")})
        return n[-1] if n else None

    def tokens_of(sel):
        return f"{count(sel):,} tokens" if count(sel) else "tokens ?"

    whole = count(periodic) is not None and count(periodic) == count(final)  # val_max_tokens covered the split
    part = "full split" if whole else "subset" if count(final) else "up to train.val_max_tokens"
    return {"train": series(train, "loss", "train loss", "loss"),
            "val_periodic": series(periodic, "bpb", f"periodic val ({part}: {tokens_of(periodic)})", "bpb"),
            "val_final": series(final, "bpb", f"final val (full split: {tokens_of(final)})", "bpb"),
            "roundtrip": series(rt, "bpb", "artifact round trip (full split)", "bpb"),
            **({"sliding": series(sliding, "bpb", "artifact, sliding windows (full split)", "bpb")} if sliding else {}),
            **({"ttt": series(ttt, "bpb", "artifact, score-first TTT (full split)", "bpb")} if ttt else {})}


def plot_run(rows: list[dict], path: Path, title: str = "") -> None:
    """PNG: train loss and val bpb (periodic, final, round trip: separate series) against training time
    and tokens, titled with the run's name; every point marked, so a run of a few steps stays readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    series = curve_series(rows)
    styles = {"train": dict(lw=0.8), "val_periodic": dict(marker="o", ls="-", ms=4),
              "val_final": dict(marker="*", ls="none", ms=12), "roundtrip": dict(marker="x", ls="none", ms=9),
              "sliding": dict(marker="+", ls="none", ms=11), "ttt": dict(marker="D", ls="none", ms=6)}
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
            ax.ticklabel_format(axis="y", useOffset=False)  # 2.8612, not 0.0012 under a "+2.86"
            if xkey == "tokens":  # 200k, 1.5M: full counts ran into each other
                ax.xaxis.set_major_locator(MaxNLocator(6))
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.margins(0.05, 0.15)  # a point at the edge of the data (a run's last validations) stays visible
            right = max((max(v[xkey]) for v in series.values() if v["panel"] == panel and v[xkey]), default=0)
            ax.set_xlim(0, 1.05 * right or 1.0)
            if ax.lines:
                ax.legend(fontsize=8)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 120)[:3]), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write(path, [buf.getvalue()])  # renamed into place: never written through a symlink
