"""Score a run's checkpoint or artifact on the full val split in exact bits per byte: `python -m frontier_jax.evaluate`.

    python -m frontier_jax.evaluate --run DIR [--step N | --artifact [PATH]] [--data DIR] [--tokenizer PATH]
                                    [--eval-seq-len T] [--stride N] [--batch-seqs N] [--ttt [--ttt-qat 0|1]] [--json]

The run's config.json and its newest intact checkpoint (a corrupt newer one is skipped with one line
on stderr naming it; `--step N` picks one) give the model; the forward is the training one
(`steps.make_eval_step` over `GPT.__call__`), jit-compiled once: the last batch is padded with
masked rows. Default: the baseline protocol (docs/evaluation.md), non-overlapping windows of the run's
eval length (eval.seq_len, else train.seq_len; `--eval-seq-len T` another) over the whole val split, cut to
whole windows of the longer of train.seq_len and that length (+1 target token), as the run and the record cut
it. With `--stride N` <= T, windows overlap and every target is still scored exactly once, with the longest
context available: the sliding window is only a score mask, mask[b, t] = t >= score_from[b].
`--artifact [PATH]` scores an artifact instead (`frontier_jax.interop.artifact`; default the run's own,
`final_model.int8.ptz` or `final_model.int6.ptz` by its eval.artifact): int8+zlib (written by either trainer or
the official script) or int6+lzma (ours or record 2026-03-23's), told apart by the file's bytes; its dequantized
weights are scored, as the contest scores them: the result equals the run's own round-trip line.
`--ttt` scores with score-first test-time training instead (`frontier_jax.ttt`, the run's `ttt` section, enabled
for this evaluation: windows of train.seq_len at `--stride`, else eval.stride, each chunk scored before the weights
train on it), from the checkpoint's weights, or the artifact's with `--artifact` (as the run's TTT stage): the
record's progress lines on stderr, then `legal_ttt` and `legal_ttt_exact`. TTT's training forwards run with the
late-QAT flag the weights were trained to (`_ttt_qat`): the checkpoint's (on once its run switched late QAT on);
an artifact's is its config's (`schedules.late_qat_at_end`: on where a run of the config that reaches its end has
it on, the record's case); `--ttt-qat 0|1` sets it (a state from elsewhere, e.g. an imported one).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from frontier_jax.config import ConfigError
from frontier_jax.data.shards import DataError
from frontier_jax.errors import ArgumentParser, BadInput, int_in


class EvalError(BadInput):
    """An evaluation whose result is not a number (exit 2, one line): never printed as a score."""


def _ngram_bias(run_dir: Path, cfg, log=None):
    """(bias_fn, device tables) of an n-gram run: the snapshot its final evaluation used, or empty tables
    (said so) when the builder published none, as the run itself was scored; (None, None) otherwise."""
    if not cfg.ngram.enabled:
        return None, None
    import jax

    from frontier_jax.ngram import runtime as ngram_runtime
    from frontier_jax.ngram.bias import empty_tables, tables_to_device
    from frontier_jax.ngram.network_eval import run_snapshot
    from frontier_jax.ngram.snapshot import load_snapshot

    snap = run_snapshot(run_dir)
    if snap is None:
        if log is not None:
            log(f"{run_dir}/ngram-p0: no n-gram snapshot was published; scoring with empty tables (the bias is "
                "inactive, as in the run's final evaluation)")
        return ngram_runtime.bias_fn, jax.device_put(empty_tables(cfg.ngram))
    try:
        return ngram_runtime.bias_fn, tables_to_device(load_snapshot(snap), cfg.ngram.confidence_buckets)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{snap}: unreadable n-gram snapshot ({type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0][:160]})") from None


def _artifact_params(run_dir: Path, path):
    """(config, graphdef, params, compute dtype, format) from an artifact's dequantized weights (either format),
    its decompression bounded by the model's size."""
    import jax
    import numpy as np

    from frontier_jax import optim
    from frontier_jax.interop import artifact, quantize
    from frontier_jax.interop.state_dict import abstract_state, read_run_config, state_dict_to_params

    cfg, dtypes = read_run_config(run_dir)
    graphdef, aparams, _ = abstract_state(cfg, dtypes.compute, optim.build_optimizer(cfg.optim, dtypes.muon_ns))
    sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(aparams)]
    fmt, sd = artifact.load(path, quantize.raw_limit(sum(sizes), len(sizes)))
    # (the record's own artifact holds its unbanked names: state_dict_to_params maps the recipe's parameters)
    return cfg, graphdef, state_dict_to_params(sd, aparams, source=str(path)), dtypes.compute, fmt


def evaluate_run(run_dir, data_dir=None, tokenizer=None, stride=None, batch_seqs=None, step=None, log=None,
                 artifact=None, eval_seq_len=None, ttt=False, ttt_qat=None) -> dict:
    """Sums and bpb of a run's newest intact (or given) checkpoint on its val split (see the module docstring),
    or of the artifact `artifact` (its dequantized weights, in the run's model); with `ttt`, of score-first
    test-time training from those weights (`ttt_qat` 0 / 1: its late-QAT flag, default `_ttt_qat`'s)."""
    from frontier_jax import ops
    from frontier_jax.data.dataset import load_dataset
    from frontier_jax.data.stream import val_batches
    from frontier_jax.policies.scoring import bpb
    from frontier_jax.run.host import tune_allocator
    from frontier_jax.interop.state_dict import read_run_config, restore_params
    from frontier_jax.steps import evaluate_batches, make_eval_step, q_gains

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: run directory does not exist")
    t0 = time.perf_counter()
    cfg, _ = read_run_config(run_dir)  # inputs are checked before any array is restored
    tune_allocator(cfg.train.allocator)  # as the run trained; before the JAX backend starts (frontier_jax.run.host)
    data_dir = data_dir or cfg.data.data_dir
    tok_spec = tokenizer or cfg.data.tokenizer
    if not data_dir:
        raise DataError(f"{run_dir}/config.json: no data directory recorded; pass --data DIR")
    if ttt:
        cfg = ttt_config(cfg, stride, eval_seq_len)
        eval_seq_len, stride = cfg.train.seq_len, cfg.ttt_stride
    T = cfg.eval_seq_len if eval_seq_len is None else int(eval_seq_len)
    if T <= 0:
        raise ConfigError(f"--eval-seq-len {T}: must be positive")
    stride = T if stride is None else int(stride)
    if not 0 < stride <= T:
        raise ConfigError(f"--stride {stride}: must be in [1, eval seq_len={T}]")
    sliding = stride != T
    batch_seqs = int(batch_seqs or (cfg.eval.batch_seqs if sliding else 0) or cfg.train.val_batch_seqs)
    if batch_seqs <= 0:
        raise ConfigError(f"--batch-seqs {batch_seqs}: must be positive")
    data = load_dataset(data_dir, tok_spec, cfg.model.vocab_size, max(cfg.val_seq_len, T), cfg.data.train_pattern,
                        cfg.data.val_pattern, f"model.vocab_size of {run_dir}")
    tok, tokens = data.tokenizer, data.val_tokens
    ops.configure(cfg.train.kernels, model=cfg.model)
    fmt = None
    run_cfg = cfg
    if artifact is not None:
        cfg, graphdef, params, dtype, fmt = _artifact_params(run_dir, Path(artifact))
        step = None
    else:
        cfg, graphdef, params, step, dtype = restore_params(run_dir, step, log)
    cfg = run_cfg if ttt else cfg  # (the same run config, TTT enabled)
    bias_fn, aux = _ngram_bias(run_dir, cfg, log)
    extra = {}
    if ttt:
        sums, extra = ttt_sums(cfg, graphdef, params, tokens, data.tables, bias_fn, aux, batch_seqs, log,
                                _ttt_qat(run_dir, cfg, step, artifact, ttt_qat))
    else:
        # the qk_attention forward the kernel path runs for these gains (frontier_jax.ops.attention_forward)
        exact = not ops.bounded_shift_valid(float(ops.score_bound(q_gains(params), cfg.model.head_dim)), T)
        eval_step = make_eval_step(graphdef, data.tables, bias_fn, attention_exact=exact)
        batches = val_batches(tokens, T, batch_seqs, stride=stride if sliding else None)
        sums = evaluate_batches(eval_step, params, batches, aux)
    score = bpb(sums["nll_sum_nats"], sums["bytes"])
    if not math.isfinite(score):
        what = artifact if artifact is not None else f"{run_dir}/checkpoints/{step}"
        raise EvalError(f"{what}: val bpb is {score} (a non-finite loss on the val split: the "
                        f"{'artifact' if artifact is not None else 'checkpoint'}'s parameters or the shards are broken)")
    return {
        **sums,
        "bpb": score,
        "loss": sums["nll_sum_nats"] / max(sums["tokens"], 1),
        "stride": stride, "seq_len": T, "batch_seqs": batch_seqs,
        "run": str(run_dir), "checkpoint_step": step, "compute_dtype": str(dtype),
        "artifact": None if artifact is None else str(artifact), "artifact_format": fmt,
        "data_dir": str(data_dir), "tokenizer": str(tok.path), "data_provenance": data.provenance,
        "seconds": time.perf_counter() - t0, **extra,
    }


def ttt_config(cfg, stride, eval_seq_len):
    """The run's config with its TTT section enabled (its stride `stride` when given): TTT's windows are
    train.seq_len long, so another --eval-seq-len is refused."""
    import dataclasses

    if eval_seq_len is not None and int(eval_seq_len) != cfg.train.seq_len:
        raise ConfigError(f"--ttt --eval-seq-len {eval_seq_len}: test-time training scores windows of the run's "
                          f"train.seq_len={cfg.train.seq_len} (as the record's)")
    ev = cfg.eval if stride is None else dataclasses.replace(cfg.eval, stride=int(stride))
    try:
        return dataclasses.replace(cfg, eval=ev, ttt=dataclasses.replace(cfg.ttt, enabled=True))
    except ConfigError as e:
        raise ConfigError(f"--ttt: {e}") from None


def _ttt_qat(run_dir: Path, cfg, step, artifact, ttt_qat) -> tuple[bool, str]:
    """(the late-QAT flag of TTT's training forwards, where it comes from): `--ttt-qat` when given; else an
    artifact's from its config (`schedules.late_qat_at_end`: the artifact holds no flag); else the checkpoint's
    (its meta's `late_qat_step`: the run's steps from then on trained with it, and so does its TTT)."""
    from frontier_jax import checkpoint
    from frontier_jax.policies.schedules import late_qat_at_end

    if ttt_qat is not None:
        return bool(ttt_qat), "--ttt-qat"
    if artifact is not None:
        return late_qat_at_end(cfg.optim), f"the config's: optim.late_qat_threshold={cfg.optim.late_qat_threshold}"
    on = checkpoint.read_meta(run_dir, step)[1].get("late_qat_step")
    return on is not None, f"checkpoint {step}'s" + (f": on from step {on + 1}" if on is not None else "")


def ttt_sums(cfg, graphdef, params, tokens, tables, bias_fn, aux, batch_seqs, log,
              qat: tuple[bool, str]) -> tuple[dict, dict]:
    """(sums, the pass's counts and times) of score-first TTT from `params` (frontier_jax.ttt), the training
    forwards with the late-QAT flag `qat` (`_ttt_qat`: flag, source)."""
    import dataclasses

    from frontier_jax import ttt
    from frontier_jax.steps import make_eval_step, make_ttt_step

    log = log or (lambda msg: None)
    flag = qat[0] if qat[0] or cfg.optim.late_qat_threshold > 0 else None  # (None: a step without the flag)
    log(f"late QAT in TTT's training forwards: {'on' if qat[0] else 'off'} ({qat[1]})")
    eval_step = make_eval_step(graphdef, tables, bias_fn, attention_exact=True)
    train_step = make_ttt_step(graphdef, ttt.sgd(cfg.ttt), bias_fn, attention_exact=True, late_qat=flag is not None)
    ttt.warm_up(params, tokens.shape[0], cfg, eval_step, train_step, aux, batch_seqs=batch_seqs,
                qat=flag)  # before the pass
    r = ttt.run(params, tokens, cfg, eval_step, train_step, aux, log=log, batch_seqs=batch_seqs, qat=flag)
    info = {k: r[k] for k in ("chunks", "windows", "sgd_steps", "seconds", "score_seconds", "train_seconds",
                              "estimate", "hardware")}
    return {k: r[k] for k in ("nll_sum_nats", "tokens", "bytes")}, {
        "ttt": {**info, **dataclasses.asdict(cfg.ttt), "late_qat": qat[0], "late_qat_from": qat[1]}}


def _run_artifact(run_dir: Path) -> Path:
    """The artifact a run writes (its eval.artifact's file name)."""
    from frontier_jax.interop.artifact import artifact_path
    from frontier_jax.run.rundir import read_config

    return artifact_path(run_dir, read_config(run_dir).eval.artifact)


def main(argv=None) -> int:
    """0 on success; bad input exits 2 with one line through `exit_on_error` (SystemExit)."""
    from frontier_jax.errors import exit_on_error

    ap = ArgumentParser(prog="python -m frontier_jax.evaluate", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="run directory (config.json + checkpoints/)")
    ap.add_argument("--step", type=int_in(0), help="checkpoint step to score (default: the newest intact one)")
    ap.add_argument("--data", help="shard directory (default: the run's data.data_dir)")
    ap.add_argument("--tokenizer", help="tokenizer (default: the run's data.tokenizer)")
    ap.add_argument("--eval-seq-len", type=int_in(1), metavar="T",
                    help="window length (default the run's eval.seq_len, else train.seq_len)")
    ap.add_argument("--stride", type=int_in(1), help="sliding-window stride, every target scored once (default the "
                                                     "window length: non-overlapping windows)")
    ap.add_argument("--batch-seqs", type=int_in(1), help="windows per eval batch (default train.val_batch_seqs; "
                                                         "sliding: eval.batch_seqs when set)")
    ap.add_argument("--artifact", nargs="?", const="", metavar="PATH",
                    help="score an artifact instead of a checkpoint: int8+zlib or int6+lzma, told apart by its bytes "
                         "(default PATH: the run's final_model.int8.ptz or final_model.int6.ptz, by its "
                         "eval.artifact; the official script's or the record's artifact of the same model works too)")
    ap.add_argument("--ttt", action="store_true",
                    help="score with score-first test-time training (the run's ttt section; from the checkpoint's "
                         "weights, or the artifact's with --artifact): the record's progress lines on stderr, then "
                         "legal_ttt")
    ap.add_argument("--ttt-qat", type=int, choices=(0, 1),
                    help="with --ttt: the late-QAT flag of TTT's training forwards (default: the checkpoint's; "
                         "with --artifact, on where the config's run ends with late QAT on)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    with exit_on_error():
        artifact = None
        if args.artifact is not None:
            artifact = args.artifact or str(_run_artifact(Path(args.run)))
        if artifact is not None and args.step is not None:
            raise ConfigError("--step and --artifact: choose one (an artifact has no checkpoint step)")
        if args.ttt_qat is not None and not args.ttt:
            raise ConfigError("--ttt-qat: only with --ttt (the late-QAT flag of test-time training)")
        r = evaluate_run(args.run, args.data, args.tokenizer, args.stride, args.batch_seqs, args.step,
                         log=lambda msg: print(msg, file=sys.stderr, flush=True), artifact=artifact,
                         eval_seq_len=args.eval_seq_len, ttt=args.ttt, ttt_qat=args.ttt_qat)
    if args.json:
        print(json.dumps(r, sort_keys=True, allow_nan=False))
    elif args.ttt:
        from frontier_jax.config import TTT_LINE
        from frontier_jax.run.roundtrip import score_lines

        print("\n".join(score_lines(TTT_LINE, r["loss"], r["bpb"], r["ttt"]["seconds"])))  # the pass's time
    else:
        what = f"artifact {r['artifact']}" if artifact is not None else f"step {r['checkpoint_step']}"
        print(f"{r['run']} {what}: val_bpb {r['bpb']:.6f} (loss {r['loss']:.4f} nats, "
              f"{r['tokens']:,} tokens, {r['bytes']:,} bytes, stride {r['stride']}/{r['seq_len']}, {r['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
