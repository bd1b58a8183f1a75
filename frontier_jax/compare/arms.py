"""python -m frontier_jax.compare: is B better than A, and is the difference real?

    python -m frontier_jax.compare --arm jax:configs/tiny.py --arm torch:configs/tiny.py \\
        --data DIR --tokenizer PATH --budget 60 --seeds 2 --out DIR

Arm specs (`--arm`, two or more, optionally prefixed by `LABEL=`):
  jax:CONFIG [ARGS]    python -m frontier_jax.train --config CONFIG ARGS (e.g. --set model.num_layers=3)
  torch:CONFIG [ARGS]  python -m baseline_torch.train --config CONFIG ARGS (e.g. --compile, --threads 1)
  cmd:COMMAND          any shell command (e.g. `cd DIR && python train_gpt.py`, the official script or record
                       2026-03-23's) whose output has a `val_bpb:` line (the last one counts; the final score lines
                       `final_int8_zlib_roundtrip`, `final_int6_roundtrip`, `..._sliding_window`, `legal_ttt` and
                       their `_exact` twins give its final pipeline's scores: frontier_jax.compare.collect);
                       {seed} {budget} {data} {tokenizer} {out} are substituted, and SEED,
                       MAX_WALLCLOCK_SECONDS, DATA_PATH, TOKENIZER_PATH, RUN_ID are set in its environment
                       (the names the official train_gpt.py reads).
Every jax/torch arm gets the same --data, --tokenizer, --budget and per-seed --seed (seed_base + k);
an arm that tries to set its own data, tokenizer, budget, seed or output is refused before anything
runs, as is a config whose vocabulary differs from the tokenizer or shards made by another tokenizer.
Runs are interleaved (A B A B ...), each a subprocess with its own run directory under OUT/runs/.
After every run OUT/results.json, OUT/results.md and OUT/val_bpb.png are rewritten, so an interrupted
comparison keeps every finished run. Statistics: frontier_jax.compare.stats (Welch t, verdicts).
The score every arm is compared by is `--score` (val, roundtrip, sliding, ttt; default auto: the round trip
when every arm has one, else the plain val_bpb); a run without that score is not ok.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from frontier_jax.compare.collect import FIELDS, collect, log_tail, strict_json
from frontier_jax.compare.report import plot_title, render_markdown, render_plot
from frontier_jax.compare.stats import (SCORE_CHOICES, THROUGHPUT_TOLERANCE, confounders, describe, remedies,
                                        score_key, throughput_flags, verdict)
from frontier_jax.config import MAX_SEED, ConfigError, apply_overrides, load_config
from frontier_jax.data.prepare import read_manifest
from frontier_jax.data.shards import list_shards
from frontier_jax.data.tokenizer import check_vocab, load_tokenizer
from frontier_jax.errors import ArgumentParser, BadInput, EXIT_INTERRUPTED, EXIT_OK, exit_on_error, float_in, int_in
from frontier_jax.data.shards import atomic_write_text

KINDS = {"jax": "frontier_jax.train", "torch": "baseline_torch.train"}
FORBIDDEN_ARGS = ("--data", "--tokenizer", "--budget", "--seed", "--out", "--resume")
FORBIDDEN_SETS = ("data.", "train.budget_seconds", "train.seed")
LABEL_RE = re.compile(r"^([A-Za-z0-9_.+-]+)=(jax|torch|cmd):(.*)$", re.S)


class CompareError(BadInput):
    """Input that makes the comparison meaningless; refused before any run starts (exit 2)."""


@dataclasses.dataclass
class Arm:
    label: str
    kind: str  # jax | torch | cmd
    spec: str
    config: str = ""
    args: list[str] = dataclasses.field(default_factory=list)
    command: str = ""


def parse_arm(spec: str, index: int) -> Arm:
    m = LABEL_RE.match(spec.strip())
    if m:
        label, kind, rest = m.groups()
    else:
        kind, sep, rest = spec.strip().partition(":")
        if not sep or kind not in ("jax", "torch", "cmd"):
            raise CompareError(f"--arm {spec!r}: expected [LABEL=]jax:CONFIG, [LABEL=]torch:CONFIG "
                               f"or [LABEL=]cmd:COMMAND")
        label = None
    rest = rest.strip()
    if not rest:
        raise CompareError(f"--arm {spec!r}: nothing after '{kind}:'")
    if kind == "cmd":
        return Arm(label or f"{chr(65 + index % 26)}-cmd", kind, spec, command=rest)
    words = shlex.split(rest)
    config, args = words[0], words[1:]
    for i, w in enumerate(args):
        if w.split("=")[0] in FORBIDDEN_ARGS:
            raise CompareError(f"--arm {spec!r}: {w.split('=')[0]} is set by compare for every arm (same data, "
                               f"tokenizer, budget, seeds); remove it from the arm")
        if w == "--set" and i + 1 < len(args) and args[i + 1].startswith(FORBIDDEN_SETS):
            raise CompareError(f"--arm {spec!r}: --set {args[i + 1]} would give this arm its own data, budget "
                               f"or seed; all jax/torch arms share --data/--tokenizer/--budget/--seeds")
    return Arm(label or f"{chr(65 + index % 26)}-{kind}-{Path(config).stem}", kind, spec, config=config, args=args)


def _arm_sets(arm: Arm) -> list[str]:
    return [arm.args[i + 1] for i, w in enumerate(arm.args[:-1]) if w == "--set"]


def match_core_count(arms: list[Arm]) -> list[str]:
    """The same core count for jax and torch arms: the PyTorch baseline trains in one process on one
    device (on trn1 PyTorch/XLA's default device, one NeuronCore, docs/comparison.md, "The PyTorch baseline on trn1"),
    while the JAX trainer takes every device by default (both NeuronCores of a trn1.2xlarge). When a torch
    arm is compared, each jax arm that does not choose `parallel.num_devices` itself gets
    `--set parallel.num_devices=1` (appended to its args). Returns one note per arm changed."""
    if not any(a.kind == "torch" for a in arms):
        return []
    notes = []
    for arm in arms:
        if arm.kind == "jax" and not any(s.startswith("parallel.num_devices") for s in _arm_sets(arm)):
            arm.args += ["--set", "parallel.num_devices=1"]
            notes.append(f"arm {arm.label}: --set parallel.num_devices=1 (the torch arms train on one device)")
    return notes


def validate(arms: list[Arm], data: str | None, tokenizer: str | None) -> dict:
    """Refuse mismatched or broken input before anything runs; returns facts for the report."""
    if len(arms) < 2:
        raise CompareError("compare needs at least two --arm")
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise CompareError(f"arm labels must be unique, got {labels}")
    facts = {"vocab_size": None, "tokenizer_sha256": None}
    trainers = [a for a in arms if a.kind in KINDS]
    if trainers and not (data and tokenizer):
        raise CompareError("jax/torch arms need --data DIR and --tokenizer PATH (shared by all arms)")
    tok = None
    if data or tokenizer:
        if not (data and tokenizer):
            raise CompareError("give both --data and --tokenizer")
        tok = load_tokenizer(tokenizer)
        facts["tokenizer_sha256"] = tok.sha256
        manifest = Path(data) / "manifest.json"
        if manifest.is_file():
            made_with = read_manifest(data)  # one line naming the file when it is unreadable
            made_with = made_with.get("tokenizer") if isinstance(made_with, dict) else None
            if not isinstance(made_with, dict):
                raise CompareError(f"{manifest}: incomplete manifest (no tokenizer entry)")
            if made_with.get("sha256") and made_with["sha256"] != tok.sha256:
                raise CompareError(f"{manifest}: shards were made with tokenizer {made_with.get('path')}, "
                                   f"not {tokenizer} (sha256 differs)")
    patterns = set()
    for arm in trainers:
        if not Path(arm.config).is_file():
            raise CompareError(f"arm {arm.label}: config file {arm.config} not found")
        try:
            cfg = apply_overrides(load_config(arm.config), _arm_sets(arm))
        except ConfigError as e:
            raise CompareError(f"arm {arm.label}: {e}") from None
        check_vocab(tok, cfg.model.vocab_size, f"arm {arm.label} model.vocab_size")
        patterns.add((cfg.data.train_pattern, cfg.data.val_pattern))
        facts["vocab_size"] = cfg.model.vocab_size
    for train_pattern, val_pattern in patterns:
        list_shards(data, train_pattern), list_shards(data, val_pattern)  # DataError if missing
    if len(patterns) > 1:
        raise CompareError(f"arms read different shard patterns {sorted(patterns)}: not the same data")
    for arm in arms:
        if arm.kind == "cmd":
            _check_command(arm)
    return facts


def _check_command(arm: Arm) -> None:
    """A cmd: arm's shell syntax (bash -n) and its first command (a program on PATH, a path, or a shell
    builtin such as `cd DIR && ...`)."""
    try:
        words = shlex.split(arm.command)
    except ValueError as e:
        raise CompareError(f"arm {arm.label}: command {arm.command!r}: {e}") from None
    syntax = subprocess.run(["bash", "-n", "-c", arm.command], capture_output=True, text=True)
    if syntax.returncode:
        raise CompareError(f"arm {arm.label}: shell syntax error in {arm.command!r}: "
                           f"{(syntax.stderr.strip().splitlines() or [''])[-1]}")
    first = words[0] if words else ""
    kind = subprocess.run(["bash", "-c", f"type -t {shlex.quote(first)}"], capture_output=True, text=True).stdout.strip()
    if not first or (kind in ("", "file") and shutil.which(first) is None and not Path(first).exists()):
        raise CompareError(f"arm {arm.label}: command {first or arm.command!r} not found")


def default_threads() -> int:
    """A torch arm's intra-op threads unless it sets --threads: the CPUs this process may run on (runs
    are sequential, so one run never competes with another of the comparison)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def build_command(arm: Arm, seed: int, run_dir: Path, a: argparse.Namespace) -> list[str]:
    """The arm's command line. A `cmd:` arm gets {seed} {budget} {data} {tokenizer} {out} substituted and
    SEED, MAX_WALLCLOCK_SECONDS, DATA_PATH, TOKENIZER_PATH, RUN_ID added to the environment it inherits
    (through `env`, so this process reads no environment variables)."""
    if arm.kind in KINDS:
        threads = []
        if arm.kind == "torch" and not any(w.split("=")[0] == "--threads" for w in arm.args):
            # torch's own default can oversubscribe a container; --threads N: the N CPUs every run is pinned to
            threads = ["--threads", str(getattr(a, "threads", None) or default_threads())]
        return [sys.executable, "-m", KINDS[arm.kind], "--config", arm.config, "--data", a.data, "--tokenizer",
                a.tokenizer, "--budget", str(a.budget), "--seed", str(seed), "--out", str(run_dir), *arm.args,
                *threads]
    subs = {"seed": str(seed), "budget": str(a.budget), "data": a.data or "", "tokenizer": a.tokenizer or "",
            "out": str(run_dir)}
    command = arm.command
    for k, v in subs.items():
        command = command.replace("{" + k + "}", shlex.quote(v))
    extra = [f"SEED={subs['seed']}", f"MAX_WALLCLOCK_SECONDS={subs['budget']}", f"DATA_PATH={subs['data']}",
             f"TOKENIZER_PATH={subs['tokenizer']}", f"RUN_ID={run_dir.name}"]
    return ["env", *extra, "bash", "-c", command]


def aggregate(arms: list[Arm], runs: list[dict], score: str = "auto",
              meta: dict | None = None) -> tuple[list[dict], list[dict], dict]:
    """Per-arm summaries, per-pair verdicts (every pair i < j, B = later arm, A = earlier arm) and the
    conditions: which score (`--score`; auto: round-trip when every arm has one), the throughput flags and, when
    a flag confounds a verdict, the remedies (`stats.remedies`, from `meta`'s budget, threads, CPUs and max load)."""
    meta = meta or {}
    key, scored_by = score_key(runs, score)
    labels = [a.label for a in arms]
    flags = throughput_flags(labels, runs)
    per_arm = []
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm.label]
        ok = [r for r in mine if r["status"] == "ok"]

        def mean_of(key):
            return describe([r[key] for r in ok if r.get(key) is not None])["mean"]

        per_arm.append({"arm": arm.label, "kind": arm.kind, "spec": arm.spec, "runs": len(mine), "ok": len(ok),
                        "failed": len(mine) - len(ok), "steps": mean_of("steps"), "tokens": mean_of("tokens"),
                        "tokens_per_second": mean_of("tokens_per_second"),
                        "score": describe([r[key] for r in ok]), "val_bpb": describe([r["val_bpb"] for r in ok]),
                        "roundtrip_val_bpb": describe([r.get("roundtrip_val_bpb") for r in ok]),
                        "confounded": flags["arms"].get(arm.label, [])})
    pairs = []
    for i in range(len(arms)):
        for j in range(i + 1, len(arms)):
            a = [r[key] for r in runs if r["arm"] == arms[i].label and r["status"] == "ok"]
            b = [r[key] for r in runs if r["arm"] == arms[j].label and r["status"] == "ok"]
            p = {"a": arms[i].label, "b": arms[j].label, **verdict(a, b, arms[i].label, arms[j].label)}
            p["confounded"] = confounders(flags, p["a"], p["b"])
            if p["confounded"]:
                p["text"] = f"CONFOUNDED ({'; '.join(p['confounded'])}): {p['text']}"
            pairs.append(p)
    conditions = {"score": key, "scored_by": scored_by, "throughput_tolerance": THROUGHPUT_TOLERANCE,
                  "flags": [*flags["runs"].values(), *(x for v in flags["arms"].values() for x in v
                                                       if x not in flags["runs"].values()),
                            *(x for v in flags["pairs"].values() for x in v)],
                  "remedies": remedies(flags, runs, meta.get("budget_seconds", 0.0), meta.get("threads"),
                                       meta.get("cpus"), meta.get("max_load"))}
    return per_arm, pairs, conditions


def write_outputs(out: Path, meta: dict, arms: list[Arm], runs: list[dict]) -> dict:
    per_arm, pairs, conditions = aggregate(arms, runs, meta.get("score", "auto"), meta)
    results = strict_json({**meta, "arms": per_arm, "pairs": pairs, "conditions": conditions, "runs": runs})
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
    atomic_write_text(out / "results.md", render_markdown(results))
    render_plot(runs, [a.label for a in arms], out / "val_bpb.png", plot_title(results), conditions["flags"])
    return results


def parse_args(argv):
    p = ArgumentParser(prog="python -m frontier_jax.compare", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--arm", action="append", default=[], required=True, metavar="SPEC",
                   help="[LABEL=]jax:CONFIG [ARGS], [LABEL=]torch:CONFIG [ARGS] or [LABEL=]cmd:COMMAND (two or more; "
                        "see below)")
    p.add_argument("--data", help="shard directory shared by all jax/torch arms")
    p.add_argument("--tokenizer", help="tokenizer (.model or 'bytes') shared by all jax/torch arms")
    p.add_argument("--budget", type=float_in(0, lo_open=True), required=True, help="training budget in seconds for every run")
    p.add_argument("--seeds", type=int_in(1), default=2, help="runs per arm (default 2)")
    p.add_argument("--seed-base", type=int_in(0, MAX_SEED), default=1337, help="seeds are seed_base, seed_base + 1, ...")
    p.add_argument("--out", required=True, help="output directory (results.json, results.md, val_bpb.png, runs/)")
    p.add_argument("--timeout", type=float_in(0, lo_open=True), help="seconds before a run is killed (default 3 x budget + 600)")
    p.add_argument("--score", choices=SCORE_CHOICES, default="auto",
                   help="the line every arm is scored by: val (the trained weights), roundtrip, sliding or ttt (the "
                        "final pipeline's lines on the artifact's weights); auto (default): roundtrip when every arm "
                        "has one, else val")
    p.add_argument("--threads", type=int_in(1), metavar="N",
                   help="pin every run to N CPUs (torch arms: --threads N); default: all CPUs this process may use")
    p.add_argument("--max-load", type=float_in(0, lo_open=True), metavar="L",
                   help="before each run, wait until the machine's 1-minute load average is below L (a quieter "
                        "machine; default: start at once)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    # Ctrl-C / SIGINT always interrupts (keeping finished runs), even when started from a shell that
    # ignores SIGINT for background jobs: the trainers install their own handlers, compare does too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with exit_on_error():  # bad input: one line, exit 2, before anything runs
        return compare(a)


def compare(a: argparse.Namespace) -> int:
    """Validate, then run every (seed, arm); EXIT_INTERRUPTED (finished runs kept) on SIGINT, else 0."""
    if a.seeds < 1 or a.budget <= 0:
        raise CompareError("--seeds must be >= 1 and --budget > 0")
    if a.threads is not None and not 1 <= a.threads <= default_threads():
        raise CompareError(f"--threads {a.threads}: must be 1 .. {default_threads()} (the CPUs this process may use)")
    arms = [parse_arm(s, i) for i, s in enumerate(a.arm)]
    core_notes = match_core_count(arms)
    facts = validate(arms, a.data, a.tokenizer)
    out = Path(a.out)
    if (out / "results.json").exists():
        raise CompareError(f"{out}: already holds a comparison; choose another --out")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    timeout = a.timeout or 3 * a.budget + 600
    meta = {"data": a.data, "tokenizer": a.tokenizer, "budget_seconds": a.budget, "seeds": a.seeds,
            "seed_base": a.seed_base, "score": a.score, "order": "interleaved", "started": time.strftime("%Y-%m-%d %H:%M:%S"), **facts,
            "threads": a.threads, "cpus": default_threads(), "max_load": a.max_load,
            **({"core_count": core_notes} if core_notes else {})}
    runs: list[dict] = []
    order = [(k, arm) for k in range(a.seeds) for arm in arms]  # A B A B ...
    print(f"compare: {len(arms)} arms x {a.seeds} seeds = {len(order)} runs, budget {a.budget:g} s each -> {out}")
    for note in core_notes:
        print(f"compare: {note}")
    try:
        results = _run_all(order, arms, a, out, meta, runs, timeout)
    except KeyboardInterrupt:
        write_outputs(out, meta, arms, runs)
        print(f"interrupted: {len(runs)} finished run(s) kept in {out}/results.json", file=sys.stderr)
        return EXIT_INTERRUPTED
    if results is None:
        return EXIT_INTERRUPTED
    print(render_markdown(results))
    for remedy in results["conditions"]["remedies"]:  # the confounded verdicts' remedies, last on the screen
        print(f"CONFOUNDED: remedy: {remedy}")
    print(f"wrote {out}/results.json, {out}/results.md, {out}/val_bpb.png")
    return EXIT_OK


PROGRESS_EVERY_S = 20.0  # a line about the running arm this often (its console's last line)
MAX_LOAD_WAIT_S = 600.0  # --max-load: a run starts anyway after waiting this long (and says so)


def _wait_sampling_load(proc: subprocess.Popen, timeout: float, loads: list[float], every_s: float = 1.0,
                        progress=None) -> int:
    """proc's exit code; the machine's 1-minute load average appended to `loads` every `every_s` meanwhile, and
    `progress(elapsed seconds)` called every PROGRESS_EVERY_S."""
    start = time.monotonic()
    deadline, said = start + timeout, start
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(every_s, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if now >= deadline:
                raise
            loads.append(os.getloadavg()[0])
            if progress is not None and now - said >= PROGRESS_EVERY_S:
                said = now
                progress(now - start)


def _last_line(path: Path, width: int = 110) -> str:
    """The last non-empty line of a run's console (progress bars' carriage returns split lines), shortened."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [x.strip() for x in text.replace("\r", "\n").splitlines() if x.strip()]
    last = lines[-1] if lines else "(no output yet)"
    return last if len(last) <= width else last[:width - 3] + "..."


def _wait_for_quiet(max_load: float) -> None:
    """--max-load: wait (a line every PROGRESS_EVERY_S) until the 1-minute load average is below `max_load`."""
    start = said = time.monotonic()
    while (load := os.getloadavg()[0]) >= max_load:
        now = time.monotonic()
        if now - start >= MAX_LOAD_WAIT_S:
            print(f"    the load average is still {load:.2f} after {now - start:.0f} s: starting anyway", flush=True)
            return
        if now - said >= PROGRESS_EVERY_S or now == start:
            said = now
            print(f"    waiting for a quieter machine: 1-minute load {load:.2f} >= --max-load {max_load:g} "
                  f"({now - start:.0f} s)", flush=True)
        time.sleep(2.0)


def _start_pinned(cmd: list[str], threads: int | None, **kw) -> subprocess.Popen:
    """Popen(cmd), the child pinned to the first `threads` CPUs this process may use (None: not pinned): the
    calling thread takes that affinity, the child inherits it, the thread's own is put back (no preexec_fn, which
    forks a multithreaded process unsafely)."""
    if not threads:
        return subprocess.Popen(cmd, **kw)
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(mine)[:threads])
    try:
        return subprocess.Popen(cmd, **kw)
    finally:
        os.sched_setaffinity(0, mine)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the arm's process group (its own session: the group id is its pid)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _run_all(order, arms, a, out: Path, meta: dict, runs: list[dict], timeout: float) -> dict | None:
    """Run every (seed, arm) in order, rewriting the outputs after each; None when interrupted."""
    results = None
    for n, (k, arm) in enumerate(order, 1):
        seed = a.seed_base + k
        run_dir = out / "runs" / f"{arm.label}-s{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        console = run_dir / "console.log"
        cmd = build_command(arm, seed, run_dir, a)
        if getattr(a, "max_load", None):
            _wait_for_quiet(a.max_load)
        print(f"[{n}/{len(order)}] {arm.label} seed {seed}: {shlex.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        rc, interrupted, loads = None, False, []
        progress = lambda elapsed: print(f"    {arm.label} seed {seed}: {elapsed:.0f} s | {_last_line(console)}",
                                         flush=True)
        with open(console, "w") as f:
            # Own session (and process group): a terminal Ctrl-C reaches only compare, which forwards exactly
            # one SIGINT to the group (a second one would make the trainers abort without saving); the
            # timeout kills the whole group, so nothing the arm started runs into the next arms' budgets.
            proc = _start_pinned(cmd, getattr(a, "threads", None), stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                rc = _wait_sampling_load(proc, timeout, loads, progress=progress)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
                rc = -9
                f.write(f"\n[compare] killed after the {timeout:.0f} s timeout (the arm's whole process group)\n")
            except KeyboardInterrupt:
                interrupted = True
                _kill_group(proc, signal.SIGINT)
                try:
                    proc.wait(timeout=60)  # the trainers finish their step and save on SIGINT
                except subprocess.TimeoutExpired:
                    _kill_group(proc, signal.SIGKILL)
                    proc.wait()
            _kill_group(proc, signal.SIGKILL)  # whatever the arm left behind in its group
        res = collect(run_dir, console, None if interrupted else rc, loads)
        if a.score != "auto" and res["status"] == "ok" and res[FIELDS[a.score]] is None:
            res["status"], res["log_tail"] = f"no {a.score} score (--score {a.score})", log_tail(console)
        runs.append({"arm": arm.label, "kind": arm.kind, "seed": seed, "run_dir": str(run_dir),
                     "wall_seconds": time.perf_counter() - t0, **res})
        results = write_outputs(out, meta, arms, runs)
        bpb = f"{res['val_bpb']:.4f}" if res["val_bpb"] is not None else "-"
        rt = f", round trip {res['roundtrip_val_bpb']:.4f}" if res["roundtrip_val_bpb"] is not None else ""
        took = f"{time.perf_counter() - t0:.0f} s"
        if res["status"] == "ok":
            print(f"    {arm.label} seed {seed}: ok, val_bpb {bpb}{rt} ({took})", flush=True)
        elif rc == 0 and res["status"].startswith("failed: "):  # a score compare refuses: one line, the arm named
            print(f"    {arm.label} seed {seed}: not scored: {res['status'][len('failed: '):]} ({took})", flush=True)
        else:
            print(f"    {arm.label} seed {seed}: {res['status']} ({took})\n{res['log_tail']}", flush=True)
        if interrupted:
            print(f"interrupted: {len(runs) - 1} finished run(s) kept in {out}/results.json", file=sys.stderr)
            return None
    return results
