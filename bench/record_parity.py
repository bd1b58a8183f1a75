"""Step-for-step parity of frontier_jax's training with the parameter-golf record's own code (docs/recipe.md).

    python -m bench.record_parity --record PATH/train_gpt.py --data DIR --tokenizer PATH --steps N
        [--config configs/record11_tiny.py] [--set key=value]... [--warmdown-steps W] [--ttt-tokens N] [--json]

PATH is your copy of the record's script (records/track_10min_16mb/2026-03-23_LeakyReLU_LegalTTT_ParallelMuon/
train_gpt.py of openai/parameter-golf); nothing of it is in this repository: it is imported at run time on CPU in
fp32 with FlashAttention-3 replaced by torch's SDPA (bench/record_script.py). Both sides train N steps of the
config's model and optimizer (its weight decay, clipping, bf16 Muon momentum, EMA, SWA, late QAT) from the same
initial weights on the same batches:

- the config, for parity: fp32 compute and tables (the record's fp32 run), bf16 Newton-Schulz (the record's),
  a step-based warmdown of W steps ending at step N (default W = N + 2: the lr scale falls from N / W to 1 / W, so at
  N = 5 late QAT (below 0.15) switches on for the last step; SWA (below 0.2) takes the weights after the steps that
  are a multiple of optim.swa_every: none in 5 steps at its 50, the last one with `--set optim.swa_every=1`);
- the record's side is its script under the environment of that config (`pg_record.record_env`,
  `record_training_env`); its initial state is its own initialisation (seeded as its main), which our side
  imports the way `python -m frontier_jax.interop import --format pg-record` does;
- the batches are the record's loader's (8 micro-batches of TRAIN_BATCH_TOKENS / 8 + 1 tokens each per step),
  fed to both sides: frontier_jax's stream reads one chunk of tokens_per_step + 1 per step (docs/training.md), so
  its windows differ from the second micro-batch on (the bench prints whether they agree);
- the lr scale and Muon momentum are frontier_jax's schedules (`policies.schedules`), given to both; each side
  switches late QAT by its own rule.

Prints per step both losses, both gradient norms (before clipping) and their relative differences, then the
relative RMS difference of the final trained weights and of the EMAs, sqrt(sum |ours - record|^2) / sqrt(sum
|record|^2) over all tensors (and the worst tensor). With --json the last line is one object {"ours": {"loss",
"grad_norm"}, "record": {...}, "param_rel_rms", "ema_rel_rms", "ttt", "worst"} ("worst": each comparison's
worst tensor and its own relative RMS). Exit 1 when a loss differs by more than
1e-3 relative, the trained weights by more than 1e-2 relative RMS or the TTT scores by more than 1e-3 relative
(the acceptance, below), 2 on bad input.

Then legal score-first TTT of the same weights on both sides ("ttt"; `--ttt-tokens 0`: null): the weights the
record's pipeline gives its TTT after these steps (its EMA in its dtypes through its int6 quantizer and back,
`record_script.exported_state`), scored by the record's own `eval_val_sliding_ttt` (`record_script.ttt_score`) and,
imported as `interop import --format pg-record` reads them, by frontier_jax's (`frontier_jax.ttt.run` as `evaluate
--ttt` drives it), on the same val tokens (the record's val stream cut to --ttt-tokens targets, a multiple of
train.seq_len), in chunks of the config's ttt.chunk_tokens (the record's TTT_CHUNK_TOKENS), each side's training
forwards with its late-QAT flag as its run ended. "ttt": {"ours", "record", "record_once", "targets", "chunks",
"qat"}: "record" is the record's function as it is (its tail windows re-score the last stride of targets,
docs/evaluation.md), "record_once" the same pass with every target counted once (the function's scoring forwards
recorded); frontier_jax scores every target once, so the acceptance compares "ours" with "record_once": within
1e-3 relative.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, apply_overrides, load_config
from frontier_jax.errors import ArgumentParser, BadInput, exit_on_error, int_in

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "record11_tiny.py"
# the record's fp32 CPU run: fp32 compute and tables, its bf16 Newton-Schulz, the unfused optimizer, steps warmdown
PARITY_SETS = ("model.compute_dtype='float32'", "model.embed_dtype='float32'", "optim.muon_ns_dtype='bfloat16'",
               "optim.fused=False", "optim.warmdown_mode='steps'", "train.budget_seconds=inf")
LOSS_RTOL, PARAM_RTOL, TTT_RTOL = 1e-3, 1e-2, 1e-3  # the acceptance
DEFAULT_TTT_TARGETS = 16384  # 4 chunks of record11_tiny's 4,096: 3 trained, the last scored only


def parity_config(path, steps: int, warmdown: int, sets=()) -> Config:
    """The config at `path` with `sets` (`--set`), made comparable with the record's fp32 CPU run (module doc)."""
    return apply_overrides(load_config(path), [*sets, *PARITY_SETS, f"train.max_steps={steps}",
                                               f"optim.warmdown_steps={warmdown}"])


def record_environment(cfg: Config, data, tokenizer) -> dict[str, str]:
    """The record script's environment for `cfg` (its model, evaluation, optimizer and schedule) and the data."""
    from frontier_jax.interop import pg_record

    return {**pg_record.record_env(cfg), **pg_record.record_training_env(cfg), "DATA_PATH": str(data),
            "TOKENIZER_PATH": str(tokenizer)}


def import_record_state(state: dict, cfg: Config, work: Path):
    """(graphdef, params) of the record's state dict `state` as `interop import --format pg-record` reads it (a
    `final_model.pt` and `record.env` in `work`), in the parity config's dtypes."""
    import torch

    from frontier_jax.interop import pg_record
    from frontier_jax.interop.state_dict import PG_RECORD_ENV, PG_RECORD_STATE, import_pg_record, restore_params

    src = work / "record"
    src.mkdir()
    torch.save(state, src / PG_RECORD_STATE)
    (src / PG_RECORD_ENV).write_text(pg_record.format_env(pg_record.record_env(cfg)))
    import_pg_record(src, work / "run", sets=[s for s in PARITY_SETS if s.startswith("model.")])
    imported, graphdef, params, _, _ = restore_params(work / "run")
    if imported.model != cfg.model:
        raise BadInput(f"the imported model differs from the config's: {imported.model} != {cfg.model}")
    return graphdef, params


def rel_rms(ours: dict[str, np.ndarray], record: dict[str, np.ndarray]) -> tuple[float, str, float]:
    """(sqrt(sum |ours - record|^2) / sqrt(sum |record|^2) over the keys of `record`, the worst key, its own)."""
    num = den = 0.0
    worst, worst_rel = "", -1.0
    for k, r in record.items():
        r64, o64 = np.asarray(r, np.float64), np.asarray(ours[k], np.float64)
        d, n = float(np.sum((o64 - r64) ** 2)), float(np.sum(r64 ** 2))
        num, den = num + d, den + n
        rel = math.sqrt(d / n) if n else math.sqrt(d)
        if rel > worst_rel:
            worst, worst_rel = k, rel
    return math.sqrt(num / den), worst, worst_rel


def unbanked(state: dict[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """The record's state dict in its unbanked names (ours, `state_dict.params_to_state_dict`)."""
    from frontier_jax.interop import pg_record

    return pg_record.unbank(state, cfg.model)


def ttt_scores(mod, ema: dict[str, np.ndarray], cfg: Config, tokenizer, targets: int, qat_ours: bool,
               qat_record: bool, work: Path) -> dict:
    """Both sides' legal score-first TTT of the record's exported weights from its EMA `ema` (module doc)."""
    from bench import record_script
    from frontier_jax import evaluate
    from frontier_jax.data.tokenizer import load_tokenizer
    from frontier_jax.policies.scoring import bpb

    T = cfg.train.seq_len
    args = mod.Hyperparameters()
    tokens = mod.load_validation_tokens(args.val_files, T).numpy().astype(np.int64)  # (its uint16 shards)
    n = (min(targets, tokens.shape[0] - 1) // T) * T
    if n <= 0:
        raise BadInput(f"--ttt-tokens {targets}: fewer than one window of train.seq_len={T}")
    tokens = tokens[:n + 1]
    start = record_script.exported_state(mod, ema)
    record = record_script.ttt_score(mod, start, tokens, tokenizer, qat_record)
    graphdef, params = import_record_state(start, cfg, work)
    tcfg = evaluate.ttt_config(cfg, None, None)  # as `evaluate --ttt`: the config's ttt section, enabled
    tables = load_tokenizer(str(tokenizer)).byte_tables(cfg.model.vocab_size)
    sums, info = evaluate.ttt_sums(tcfg, graphdef, params, tokens, tables, None, None,
                                    tcfg.eval.batch_seqs or tcfg.train.val_batch_seqs, None,
                                    (qat_ours, "as the run ended"))
    ours = bpb(sums["nll_sum_nats"], sums["bytes"])
    return {"ours": ours, "record": record["function"]["val_bpb"], "record_once": record["once"]["val_bpb"],
            "targets": n, "chunks": info["ttt"]["chunks"], "qat": {"ours": qat_ours, "record": qat_record},
            "scored": {"ours": sums["tokens"], "record": record["as_is"]["tokens"],
                       "record_once": record["once"]["tokens"]},
            "record_recorded_abs_diff": abs(record["as_is"]["val_bpb"] - record["function"]["val_bpb"])}


def run(record_path, data, tokenizer, steps: int, config=DEFAULT_CONFIG, warmdown: int | None = None,
        sets=(), ttt_tokens: int = DEFAULT_TTT_TARGETS) -> dict:
    """Both sides' N steps, then TTT (module doc): {"ours", "record", "param_rel_rms", "ema_rel_rms", "ttt", ...}."""
    import jax
    import jax.numpy as jnp

    from bench import record_script
    from frontier_jax import optim
    from frontier_jax.data.stream import TrainLoader
    from frontier_jax.interop.state_dict import params_to_state_dict
    from frontier_jax.policies import schedules
    from frontier_jax.policies.geometry import step_batch
    from frontier_jax.steps import make_train_step

    data, tokenizer = Path(data), Path(tokenizer)
    if not data.is_dir():
        raise BadInput(f"{data}: data directory not found")
    if tokenizer.suffix != ".model" or not tokenizer.is_file():
        raise BadInput(f"{tokenizer}: not a SentencePiece .model file")
    cfg = parity_config(config, steps, warmdown if warmdown is not None else steps + 2, sets)
    mod = record_script.load(record_path, record_environment(cfg, data, tokenizer))
    state0 = record_script.initial_state(mod)
    rec = record_script.RecordTrainer(mod, state0)
    with tempfile.TemporaryDirectory() as tmp:
        graphdef, params = import_record_state(state0, cfg, Path(tmp))
    o = cfg.optim
    tx = optim.build_optimizer(o)
    opt_state = tx.init(params)
    late_qat = o.late_qat_threshold > 0
    train_step = make_train_step(graphdef, tx, late_qat=late_qat)
    t = cfg.train
    ours_loader = TrainLoader(sorted(data.glob("fineweb_train_*.bin")), t.seq_len)  # the record's file pattern
    seqs = t.tokens_per_step // t.seq_len
    hist = {"ours": {"loss": [], "grad_norm": [], "qat": []}, "record": {"loss": [], "grad_norm": [], "qat": []}}
    same_windows, qat_on = [], False
    for i in range(steps):
        x_MBT, y_MBT = rec.next_batches()
        own_x, _ = step_batch(ours_loader, seqs, x_MBT.shape[0], t.seq_len)
        same_windows.append(bool(np.array_equal(own_x, x_MBT)))
        scale = schedules.lr_scale(o, i, 0.0, t.budget_seconds, t.max_steps)
        mom = schedules.muon_momentum(o, i)
        qat_on = qat_on or schedules.late_qat_due(o, scale)  # the driver's rule
        args = (jnp.float32(scale), jnp.float32(mom), None) + ((jnp.bool_(qat_on),) if late_qat else ())
        params, opt_state, m = train_step(params, opt_state, jnp.asarray(x_MBT), jnp.asarray(y_MBT), *args)
        r_loss, r_norm, r_qat = rec.step(x_MBT, y_MBT, scale, mom)
        for side, vals in (("ours", (float(m["loss"]), float(m["grad_norm"]), qat_on)),
                           ("record", (r_loss, r_norm, r_qat))):
            for key, v in zip(("loss", "grad_norm", "qat"), vals):
                hist[side][key].append(v)
    ours_sd = params_to_state_dict(jax.device_get(params))
    ours_ema = params_to_state_dict(jax.device_get(optim.final_params(params, opt_state)))
    p_rms, p_worst, p_worst_rel = rel_rms(ours_sd, unbanked(rec.state(), cfg))
    e_rms, e_worst, e_worst_rel = rel_rms(ours_ema, unbanked(rec.ema_state(), cfg))
    swa = {"ours": int(opt_state.swa.count) if o.swa_every else 0, "record": rec.swa_count}
    ttt = None
    if ttt_tokens:
        with tempfile.TemporaryDirectory() as tmp:
            ttt = ttt_scores(mod, rec.ema_state(), cfg, tokenizer, ttt_tokens, qat_on, hist["record"]["qat"][-1],
                             Path(tmp))
    return {**hist, "param_rel_rms": p_rms, "ema_rel_rms": e_rms, "ttt": ttt,
            "worst": {"param": [p_worst, p_worst_rel], "ema": [e_worst, e_worst_rel]}, "swa_count": swa,
            "same_windows": same_windows, "config": str(config), "steps": steps}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def verdict(res: dict) -> list[str]:
    """The acceptance's failures (empty: within it)."""
    bad = [f"step {i + 1}: loss {a:.9g} vs {b:.9g} ({_rel(a, b):.2e} > {LOSS_RTOL:g} relative)"
           for i, (a, b) in enumerate(zip(res["ours"]["loss"], res["record"]["loss"])) if _rel(a, b) > LOSS_RTOL]
    if not res["param_rel_rms"] <= PARAM_RTOL:
        bad.append(f"final weights: relative RMS {res['param_rel_rms']:.2e} > {PARAM_RTOL:g}")
    t = res["ttt"]
    if t is not None and not _rel(t["ours"], t["record_once"]) <= TTT_RTOL:
        bad.append(f"ttt: bpb {t['ours']:.9g} vs {t['record_once']:.9g} ({_rel(t['ours'], t['record_once']):.2e} > "
                   f"{TTT_RTOL:g} relative)")
    return bad


def step_cells(res: dict, i: int) -> list[str]:
    """Step i's loss and gradient-norm cells of the report's table (both sides and their relative differences)."""
    o, r = res["ours"], res["record"]
    return [f"{i + 1}", f"{o['loss'][i]:.7f}", f"{r['loss'][i]:.7f}", f"{_rel(o['loss'][i], r['loss'][i]):.1e}",
            f"{o['grad_norm'][i]:.7f}", f"{r['grad_norm'][i]:.7f}", f"{_rel(o['grad_norm'][i], r['grad_norm'][i]):.1e}"]


def averages_lines(res: dict) -> list[str]:
    """The report's lines of the final weights' and the EMAs' relative RMS."""
    w = res["worst"]
    return [f"final weights: relative RMS {res['param_rel_rms']:.3e} (worst tensor {w['param'][0]}: "
            f"{w['param'][1]:.3e})",
            f"EMA: relative RMS {res['ema_rel_rms']:.3e} (worst tensor {w['ema'][0]}: {w['ema'][1]:.3e})"]


def ttt_lines(res: dict) -> list[str]:
    """The report's TTT lines (module doc)."""
    t = res["ttt"]
    if t is None:
        return ["ttt: not scored (--ttt-tokens 0)"]
    return [f"ttt of the record's exported weights on {t['targets']} val targets ({t['chunks']} chunks), late QAT "
            f"ours / record {int(t['qat']['ours'])} / {int(t['qat']['record'])}:",
            f"  ours {t['ours']:.8f} (each target once, {t['scored']['ours']} scored)",
            f"  record {t['record']:.8f} (its eval_val_sliding_ttt as it is, {t['scored']['record']} scored)",
            f"  record {t['record_once']:.8f} (the same pass, each target once, "
            f"{t['scored']['record_once']} scored)",
            f"  ours vs record once: {_rel(t['ours'], t['record_once']):.1e} relative; vs record as it is: "
            f"{_rel(t['ours'], t['record']):.1e}"]


def _shown(path) -> str:
    """A config path as the report names it: relative to the repository when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(path)


def format_report(res: dict) -> str:
    o, r = res["ours"], res["record"]
    lines = [f"{res['steps']} steps of {_shown(res['config'])} (fp32, the record's batches), frontier_jax vs the "
             "record's train_gpt.py", "",
             "| step | loss ours | loss record | rel | grad norm ours | grad norm record | rel | late QAT ours / record |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for i in range(len(o["loss"])):
        lines.append("| " + " | ".join(step_cells(res, i)) + f" | {int(o['qat'][i])} / {int(r['qat'][i])} |")
    lines += ["", *averages_lines(res),
              f"SWA snapshots: ours {res['swa_count']['ours']}, record {res['swa_count']['record']}",
              "batches: the record's loader's, fed to both; frontier_jax's own stream gives the same windows at "
              f"steps {[i + 1 for i, s in enumerate(res['same_windows']) if s] or 'none'}",
              *ttt_lines(res)]
    bad = verdict(res)
    lines.append("acceptance (losses 1e-3 relative, weights 1e-2 relative RMS, ttt 1e-3 relative): " +
                 ("met" if not bad else "NOT met: " + "; ".join(bad)))
    return "\n".join(lines)


def to_json(res: dict) -> str:
    keep = ("loss", "grad_norm")
    return json.dumps({"ours": {k: res["ours"][k] for k in keep}, "record": {k: res["record"][k] for k in keep},
                       "param_rel_rms": res["param_rel_rms"], "ema_rel_rms": res["ema_rel_rms"], "ttt": res["ttt"],
                       "worst": res["worst"]})


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m bench.record_parity", description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="your copy of the record's train_gpt.py")
    ap.add_argument("--data", required=True, help="a directory of fineweb_train_*.bin / fineweb_val_*.bin shards")
    ap.add_argument("--tokenizer", required=True, help="the SentencePiece .model of the shards")
    ap.add_argument("--steps", type=int_in(1), required=True)
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    ap.add_argument("--warmdown-steps", type=int_in(1), default=None, help="default: steps + 2")
    ap.add_argument("--ttt-tokens", type=int_in(0), default=DEFAULT_TTT_TARGETS, metavar="N",
                    help="val targets of the TTT comparison (rounded down to a multiple of train.seq_len; 0: no TTT)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    with exit_on_error():
        res = run(a.record, a.data, a.tokenizer, a.steps, a.config, a.warmdown_steps, a.set, a.ttt_tokens)
    print(format_report(res))
    if a.json:
        print(to_json(res))
    return 1 if verdict(res) else 0


if __name__ == "__main__":
    sys.exit(main())
