"""What a run says while it trains and at its end, for both trainers (no JAX): progress, repetition, final lines.

- `Progress`, a run hook (`frontier_jax.run.interface.RunHook`'s methods): on a terminal a tqdm bar
  (tokens/s, loss, elapsed/budget) and the same lines in train.log only; off a terminal (nohup, Slurm,
  a compare arm's log) one log line every `train.log_every_steps` steps or `train.log_every_seconds`
  seconds, whichever comes first: step, tokens, tokens/s since the previous line, loss, elapsed/budget.
- Repetition: at the start the train split's size; once the timed loop has run `ESTIMATE_STEPS` steps
  or `ESTIMATE_SECONDS` seconds, the tokens the budget implies at the speed measured so far (after the
  compile warm-up) and how many passes over the train split that is, with a WARNING past one pass.
- `probe_summary`: the MFU denominator from repeated matmul probes (median, spread, how measured).
- `final_lines`: what an entry point prints last: `val_bpb: X`, then the official script's two
  round-trip lines (`frontier_jax.run.roundtrip.roundtrip_lines`).
"""

from __future__ import annotations

import math
import statistics
import sys
import time

from frontier_jax.data.shards import shard_token_count
from frontier_jax.run.roundtrip import roundtrip_lines

ESTIMATE_STEPS = 10
ESTIMATE_SECONDS = 10.0


def train_tokens(files) -> int:
    """Tokens in the train shards a trainer streams (from their headers)."""
    return sum(shard_token_count(f) for f in files)


def _budget(s: float) -> str:
    return f"{s:.0f} s" if math.isfinite(s) else "inf"


class Progress:
    """Progress lines or a bar, and the repetition estimate (module docstring). `log` is the run log
    (`rundir.RunLog`: its `file` method writes to train.log only, used under the bar); `tty` None: whether
    stdout and stderr are both a terminal; `main` False (not process 0): silent."""

    def __init__(self, log, policy, split_tokens: int, train_cfg, main: bool = True, tty: bool | None = None,
                 clock=time.monotonic):
        self.log, self.policy, self.split_tokens, self.main, self.clock = log, policy, split_tokens, main, clock
        self.every_steps = max(int(train_cfg.log_every_steps), 0)
        self.every_seconds = float(train_cfg.log_every_seconds)
        self.tty = (sys.stdout.isatty() and sys.stderr.isatty()) if tty is None else tty  # stdout to a file: lines
        self.bar = None

    def _line(self, msg: str) -> None:
        if self.main:
            (getattr(self.log, "file", self.log) if self.bar is not None else self.log)(msg)

    def on_start(self, state) -> None:
        p = self.policy
        self.start = self.last = (state.step, state.tokens, state.train_seconds)
        self.last_wall, self.estimated = self.clock(), False
        cap = p.max_steps * p.tokens_per_step / max(self.split_tokens, 1)
        self._line(f"train split: {self.split_tokens:,} tokens (one pass = {self.split_tokens / p.tokens_per_step:,.1f} "
                   f"steps of {p.tokens_per_step:,} tokens; train.max_steps={p.max_steps:,} would be {cap:,.2f} passes)")
        if self.main and self.tty:
            from tqdm.auto import tqdm

            total = round(p.budget_seconds) if math.isfinite(p.budget_seconds) else None  # --budget inf: no total
            self.bar = tqdm(total=total, initial=round(state.train_seconds), unit="s", desc="train", leave=False)

    def before_step(self, state) -> None:
        pass

    def after_step(self, state, row: dict) -> None:
        if not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
            return
        step, tokens, secs = row["step"], row["tokens"], row["train_seconds"]
        if not self.estimated and (step - self.start[0] >= ESTIMATE_STEPS or secs - self.start[2] >= ESTIMATE_SECONDS):
            self.estimated = True
            if self.bar is not None:
                self.bar.clear()
            if self.main:
                self.log(self.repetition(step, tokens, secs))
        if self.bar is not None:
            self.bar.n = round(secs) if self.bar.total is None else min(round(secs), self.bar.total)
            self.bar.set_postfix(step=step, loss=f"{row['loss']:.3f}", tok_s=f"{tokens / max(secs, 1e-9):,.0f}",
                                 refresh=False)
            self.bar.refresh()
        due_steps = self.every_steps and step % self.every_steps == 0
        if due_steps or self.clock() - self.last_wall >= self.every_seconds:
            rate = (tokens - self.last[1]) / max(secs - self.last[2], 1e-9)
            self._line(f"step {step}/{self.policy.max_steps} | {tokens:,} tokens | {rate:,.0f} tok/s | "
                       f"loss {row['loss']:.4f} | {secs:.1f}/{_budget(self.policy.budget_seconds)}")
            self.last, self.last_wall = (step, tokens, secs), self.clock()

    def repetition(self, step: int, tokens: int, secs: float) -> str:
        """How many passes over the train split the budget implies at the speed measured since the start."""
        p, (s0, t0, sec0) = self.policy, self.start
        rate = (tokens - t0) / max(secs - sec0, 1e-9)
        by_steps = p.max_steps * p.tokens_per_step
        total = min(by_steps, tokens + rate * max(p.budget_seconds - secs, 0.0)) if math.isfinite(p.budget_seconds) \
            else by_steps
        passes = total / max(self.split_tokens, 1)
        msg = (f"repetition: at {rate:,.0f} tok/s (steps {s0 + 1}-{step}) the run will train on about {total:,.0f} "
               f"tokens = {passes:,.2f} passes over the {self.split_tokens:,}-token train split")
        if passes > 1:
            msg += (f"; WARNING: more than one pass: every train token is seen about {passes:.1f} times, so the "
                    "train loss will understate the val loss")
        return msg

    def on_end(self, state) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self.on_end(None)


def probe_summary(samples: list[float], what: str) -> dict:
    """The MFU denominator from repeated matmul probes: {"matmul_peak_flops": their median, "peak_spread":
    [min, max], "peak_source": how it was measured, with the spread}."""
    med = float(statistics.median(samples))
    lo, hi = float(min(samples)), float(max(samples))
    return {"matmul_peak_flops": med, "peak_spread": [lo, hi],
            "peak_source": f"measured: median of {len(samples)} probes of a {what}, "
                           f"{lo / 1e9:,.1f}-{hi / 1e9:,.1f} GFLOP/s ({(hi - lo) / med:.0%} spread)"}


def final_lines(summary: dict) -> list[str]:
    """The entry points' last stdout lines: `val_bpb: X`, then the official round-trip lines when there are."""
    lines = []
    if summary.get("val_bpb") is not None:
        lines.append(f"val_bpb: {summary['val_bpb']:.6f}{summary.get('rules_tag', '')}")
        if summary.get("roundtrip_val_bpb") is not None:
            lines += roundtrip_lines(summary)
    return lines
