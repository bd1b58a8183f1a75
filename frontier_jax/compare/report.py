"""The comparison's Markdown table and PNG (val bpb against training steps and against tokens, every run named)."""

from __future__ import annotations

import os
from pathlib import Path

from frontier_jax.compare.stats import NOISE_BPB, THROUGHPUT_TOLERANCE

CI_NOTE = (f"diff = mean(B) - mean(A) of the score (negative: B better). 95% CI: Welch's t "
           f"(se = sqrt(sA^2/nA + sB^2/nB), Welch-Satterthwaite df, Student t quantile); none with fewer than "
           f"2 successful runs per arm. |diff| < {NOISE_BPB} bpb is noise-level by the project's rule. "
           f"'more runs' = runs per arm after which, at the observed spread, the interval would decide. "
           f"Conditions: a run whose first-quarter throughput differs from the rest of it, an arm whose runs "
           f"differ, or a pair whose throughput ratio changes between seeds, by more than a factor "
           f"{1 + THROUGHPUT_TOLERANCE:g}, confounds every verdict it is part of.")


def _f(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def render_markdown(r: dict) -> str:
    lines = [f"# Comparison ({r.get('started', '')})", "",
             f"data `{r.get('data')}`, tokenizer `{r.get('tokenizer')}`, budget {r['budget_seconds']:g} s per run, "
             f"{r['seeds']} seed(s) per arm from {r['seed_base']}, runs interleaved (A B A B ...).", "",
             f"**Score:** {r['conditions']['scored_by']}.", ""]
    flags = r["conditions"]["flags"]
    fixes = r["conditions"].get("remedies", [])
    lines += (["**CONFOUNDED:** the arms did not run under the same conditions, so the verdicts below are not "
               "evidence of a difference in the models:", "", *(f"- {x}" for x in flags), "",
               *(["**Remedy** (what compare would change, and the option that does it):", "",
                  *(f"- {x}" for x in fixes), ""] if fixes else [])] if flags else
              [f"Conditions: every run's throughput stayed within a factor {1 + THROUGHPUT_TOLERANCE:g} of its arm's "
               "and of its own first quarter.", ""])
    lines += ["| arm | kind | runs ok / total | steps | tokens | tokens/s | score mean | sd | min .. max |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for a in r["arms"]:
        v = a["score"]
        rng = f"{v['min']:.4f} .. {v['max']:.4f}" if v["min"] is not None else "-"
        lines.append(f"| {a['arm']} | {a['kind']} | {a['ok']} / {a['runs']} | {_f(a['steps'], '{:,.0f}')} | "
                     f"{_f(a['tokens'], '{:,.0f}')} | {_f(a['tokens_per_second'], '{:,.0f}')} | "
                     f"{_f(v['mean'], '{:.4f}')} | {_f(v['sd'], '{:.4f}')} | {rng} |")
    lines += ["", "| B vs A | diff (bpb) | 95% CI | df | verdict | more runs per arm |", "|---|---:|---|---:|---|---:|"]
    for p in r["pairs"]:
        ci = f"{p['ci'][0]:+.4f} .. {p['ci'][1]:+.4f}" if p["ci"] else "-"
        more = "-" if p["more_runs"] is None else str(p["more_runs"])
        lines.append(f"| {p['b']} vs {p['a']} | {_f(p['diff'], '{:+.4f}')} | {ci} | {_f(p['df'], '{:.1f}')} | "
                     f"{p['verdict']}: {p['text']} | {more} |")
    lines += ["", CI_NOTE, "", "| run | arm | seed | status | steps | tokens | throughput (first quarter / rest) "
              "| load 1m mean / max | val bpb | round trip | dir |", "|---:|---|---:|---|---:|---:|---|---|---:|---:|---|"]
    for i, run in enumerate(r["runs"], 1):
        t, load = run.get("throughput") or {}, run.get("load_1m")
        thr = (f"{_f(t.get('rate'), '{:,.3g}')} {t.get('unit', '')} ({_f(t.get('early'), '{:,.3g}')} / "
               f"{_f(t.get('late'), '{:,.3g}')})") if t.get("rate") else "-"
        ld = f"{load['mean']:.2f} / {load['max']:.2f}" if load else "-"
        lines.append(f"| {i} | {run['arm']} | {run['seed']} | {run['status']} | {_f(run['steps'], '{:,}')} | "
                     f"{_f(run['tokens'], '{:,}')} | {thr} | {ld} | {_f(run['val_bpb'], '{:.4f}')} | "
                     f"{_f(run.get('roundtrip_val_bpb'), '{:.4f}')} | `{run['run_dir']}` |")
    bad = [run for run in r["runs"] if run["status"] != "ok"]
    for run in bad:
        lines += ["", f"**{run['arm']} seed {run['seed']}: {run['status']}** (exit code {run['rc']}); "
                      f"last lines of `{run['run_dir']}/console.log`:", "", "```", run.get("log_tail", ""), "```"]
    return "\n".join(lines) + "\n"


def plot_title(r: dict) -> str:
    """The plot's title: the arms, seeds and budget, and the score the verdicts use."""
    arms = " vs ".join(a["arm"] for a in r["arms"])
    return (f"val bits/byte (lower is better): {arms}; {r['seeds']} seed(s) x {r['budget_seconds']:g} s budget "
            f"per run; verdicts by {r['conditions']['score']}")


def render_plot(runs: list[dict], labels: list[str], path: Path, title: str = "",
                confounded: list[str] | None = None) -> None:
    """Two panels: val bpb vs training steps and vs training tokens (not wall-clock: validations can span
    seconds); one line per run, named `arm seed`, one colour per arm; `title` above both, and, when the
    comparison is confounded, a red banner and frame saying its differences are not evidence (results.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ("-", "--", ":", "-.")
    seeds = sorted({run["seed"] for run in runs})
    for run in runs:
        c = colours[labels.index(run["arm"]) % len(colours)] if run["arm"] in labels else "k"
        ls = styles[seeds.index(run["seed"]) % len(styles)]
        for ax, key in zip(axes, ("step", "tokens")):
            pts = [(p[key], p["bpb"]) for p in run.get("curve", []) if p.get(key) is not None]
            if not pts:
                continue
            ax.plot(*zip(*pts), ls, marker="o", ms=3, color=c, label=f"{run['arm']} s{run['seed']}")
    axes[1].xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1.5M: full counts run into each other
    for ax, xlabel in zip(axes, ("training steps", "training tokens")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val bits/byte")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[1].set_title("(runs that report no token counts are absent here)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08 if confounded else 0, 1, 0.95 if title else 1))
    if confounded:
        fig.text(0.5, 0.02, f"CONFOUNDED: the arms did not run under the same conditions ({len(confounded)} "
                 "throughput flag(s)): differences here are not evidence; see results.md for the remedy",
                 ha="center", fontsize=9, color="white", weight="bold", bbox={"facecolor": "#c0392b", "pad": 4})
        for ax in axes:
            for side in ax.spines.values():
                side.set_edgecolor("#c0392b")
                side.set_linewidth(2)
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
