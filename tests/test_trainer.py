"""The training loop end to end on synthetic byte data: run directory, NaN stop, kill-and-resume."""

import json

import jax
import numpy as np
import pytest

from helpers import tiny_config
from frontier_jax import checkpoint, trainer
from frontier_jax.interop.state_dict import restore_params


def _train_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "val"]


@pytest.mark.slow
def test_run_end_to_end_writes_a_complete_run_directory(trained_run):
    run_dir, summary = trained_run
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 200
    assert np.isfinite(summary["val_bpb"]) and 0 < summary["val_bpb"] < 8
    assert summary["tokens"] == 200 * 512 and summary["mfu"] > 0
    for name in ("config.json", "env.json", "kernels.json", "metrics.jsonl", "summary.json", "summary.txt",
                 "curves.png", "train.log"):
        assert (run_dir / name).is_file(), name
    env = json.loads((run_dir / "env.json").read_text())
    assert env["versions"]["jax"] == jax.__version__ and env["git"] and env["compute_dtype"] == "float32"
    assert json.loads((run_dir / "config.json").read_text())["model"]["num_layers"] == 2
    assert json.loads((run_dir / "summary.json").read_text())["val_bpb"] == summary["val_bpb"]
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train, val = _train_rows(run_dir)
    assert [r["step"] for r in train] == list(range(1, 201))
    assert val[-1]["final"] and val[-1]["bpb"] == summary["val_bpb"]
    assert np.mean([r["loss"] for r in train[-10:]]) < train[0]["loss"] - 1.0  # it learned something
    assert checkpoint.latest_step(run_dir) == 200
    assert checkpoint.read_meta(run_dir)[1]["reason"] == "final"
    # progress off a terminal (train.log_every_steps=200), the repetition estimate, the run directory at the end
    log = (run_dir / "train.log").read_text()
    assert "step 200/200 | 102,400 tokens | " in log and "train split: 60,000 tokens" in log
    assert "repetition: at " in log and "WARNING: more than one pass" in log  # 102,400 tokens over 60,000
    assert f"run directory       {run_dir}" in (run_dir / "summary.txt").read_text()
    assert all(r["tokens_per_second"] > 0 and "loadavg_1m" in r for r in train)
    assert summary["peak_source"].startswith("measured: median of 5 probes") and len(summary["peak_spread"]) == 2


def test_an_existing_run_is_not_overwritten(trained_run, byte_data):
    def files():  # all but the lock file, which a start takes (and writes its pid to) before it checks
        return {p.name: p.stat().st_mtime_ns for p in trained_run[0].rglob("*") if p.name != ".lock"}

    before = files()
    with pytest.raises(trainer.RunError, match="already holds a run"):
        trainer.run(tiny_config(byte_data), trained_run[0], echo=False)
    assert files() == before


@pytest.mark.slow
def test_non_finite_loss_keeps_the_last_finite_checkpoint(byte_data, tmp_path):
    """A checkpoint written right after a diverging update (finite but huge parameters) is not kept: the
    checkpoint kept is one whose parameters gave a finite loss on the next step."""
    cfg = tiny_config(byte_data, "optim.embed_lr=1e30", "train.checkpoint_every_steps=1")
    summary = trainer.run(cfg, tmp_path / "run", echo=False)
    assert summary["stop_reason"] == "non-finite loss" and summary["steps"] < cfg.train.max_steps
    assert "val_bpb" not in summary
    train, _ = _train_rows(tmp_path / "run")
    finite = {r["step"]: np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in train}
    first_bad = min(s for s, ok in finite.items() if not ok)
    kept = checkpoint.steps(tmp_path / "run")
    assert all(s < first_bad - 1 for s in kept)  # checkpoint s is good only if step s + 1's loss was finite
    if kept:
        _, _, params, _, _ = restore_params(tmp_path / "run")
        assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree_util.tree_leaves(params))


@pytest.mark.slow
def test_checkpoint_collisions_finished_resume_corrupt_fallback_and_metrics(byte_data, tmp_path):
    """max_steps a multiple of checkpoint_every_steps (the final save meets a periodic one); resuming a
    finished run; a corrupt newest checkpoint on resume (falls back, says so); a signal on a periodic
    step; metrics.jsonl cut back to the restored step (no step twice). The first run has an infinite
    budget (`--budget inf`, #12: the progress bar has no total then)."""
    sets = ("train.max_steps=4", "train.checkpoint_every_steps=2", "train.budget_seconds=inf")
    run_dir = tmp_path / "run"
    first = trainer.run(tiny_config(byte_data, *sets), run_dir, echo=False)
    assert first["stop_reason"] == "max_steps" and np.isfinite(first["val_bpb"])
    assert checkpoint.steps(run_dir) == [2, 4] and checkpoint.read_meta(run_dir)[1]["reason"] == "periodic"

    done = trainer.run(tiny_config(byte_data, *sets), run_dir, resume=True, echo=False)
    assert done["stop_reason"] == "already finished" and "already finished at step 4" in done["note"]

    for f in (run_dir / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"garbage" * 8)
    more = ("train.max_steps=8", "train.checkpoint_every_steps=2")
    part = trainer.run(tiny_config(byte_data, *more), run_dir, resume=True, echo=False, stop_after_steps=2)
    assert part["stop_reason"].startswith("signal") and part["steps"] == 4  # stopped on periodic step 4
    log = (run_dir / "train.log").read_text()
    assert f"skipped {run_dir}/checkpoints/4: unreadable checkpoint" in log
    assert "resumed from step 2" in log and "dropped 4 metrics row(s)" in log  # train rows 3, 4, the final val, the round trip
    assert checkpoint.latest_step(run_dir) == 4 and part["checkpoint_step"] == 4
    # which qk_attention forward the kernel would run for the final gains (initialised at 1.5: the fast one)
    assert part["attention_forward"].startswith("bounded shift: score bound")
    assert "qk_attention forward for the final gains" not in log  # a Neuron-only line (summary.json keeps it)
    assert log.count("kernel table: the 7 ops this run calls run their pure-JAX references (platform cpu") == 2
    train, val = _train_rows(run_dir)
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert [r["step"] for r in val] == []  # the final val of the cut-back steps went with them


@pytest.mark.slow
def test_kill_and_resume_reproduces_the_uninterrupted_trajectory(byte_data, tmp_path):
    """Steps-mode warmdown and a step-count stop: the time-based warmdown depends on wall-clock, so it cannot
    be bit-identical; everything else (data position, optimizer state, schedule) must be."""
    sets = ("train.max_steps=8", "optim.warmdown_mode='steps'", "optim.warmdown_steps=4")
    full = trainer.run(tiny_config(byte_data, *sets), tmp_path / "full", echo=False)
    part = trainer.run(tiny_config(byte_data, *sets), tmp_path / "split", echo=False, stop_after_steps=3)
    assert part["stop_reason"].startswith("signal") and part["steps"] == 3
    assert checkpoint.read_meta(tmp_path / "split")[1]["reason"] == "interrupted"
    resumed = trainer.run(tiny_config(byte_data, *sets), tmp_path / "split", resume=True, echo=False)
    assert resumed["steps"] == full["steps"] == 8
    a, _ = _train_rows(tmp_path / "full")
    b, _ = _train_rows(tmp_path / "split")
    assert [r["step"] for r in b] == list(range(1, 9))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    assert [r["lr_scale"] for r in a] == [r["lr_scale"] for r in b]
    assert resumed["val_nll_sum_nats"] == full["val_nll_sum_nats"]


def test_attention_forward_is_chosen_on_the_host_and_each_variant_built_once():
    """The trainer's choice between the bounded-shift and the exact-max qk_attention forward: from the score
    bound the previous step returned, each variant's steps built once, a switch logged; the warm-up runs the
    train step of each forward and the eval step of each forward possible at every eval length (past
    SHIFT_MAX_T only the exact one), after which a switch builds nothing; where both forwards are one program
    (the reference path) one pair of steps serves both."""
    from frontier_jax import ops
    from frontier_jax.trainer import _AttentionVariants

    built, logged = [], []
    make = lambda kind: lambda exact: built.append((kind, exact)) or (kind, exact)
    v = _AttentionVariants(make("train"), make("eval"), True, 1024, logged.append)
    v.observe(10.0)
    assert v.train() == ("train", False) and v.eval() == ("eval", False)
    v.observe(ops.SHIFT_LIMIT * 1.01)
    assert v.train() == ("train", True) and v.switches == 1 and "exact max" in logged[-1]
    v.observe(10.0)
    assert v.train() == ("train", False) and v.switches == 2
    assert v.eval(ops.SHIFT_MAX_T * 2) == ("eval", True)  # past SHIFT_MAX_T the exact forward, whatever the bound
    assert built == [("train", False), ("eval", False), ("train", True), ("eval", True)]  # each built once

    built.clear()
    w = _AttentionVariants(make("train"), make("eval"), True, 1024, logged.append)
    ran = []
    names = w.warm_up(lambda: ran.append(w.train()), lambda window: ran.append((w.eval(), window)),
                      [(1024, "4x1024"), (ops.SHIFT_MAX_T * 2, "4x8192")], lambda: ran.append("check"))
    assert ran[::2] == [("train", False), ("train", True), (("eval", False), "4x1024"), (("eval", True), "4x1024"),
                        (("eval", True), "4x8192")] and ran[1::2] == ["check"] * 5  # a signal checked after each
    assert names == ["train step T=1024 (bounded shift)", "train step T=1024 (exact max)", "eval step 4x1024 "
                     "(bounded shift)", "eval step 4x1024 (exact max)", "eval step 4x8192 (exact max)"]
    w.observe(ops.SHIFT_LIMIT * 2)  # after the warm-up the forced forward is gone: the bound decides again
    assert w.train() == ("train", True) and w.eval(1024) == ("eval", True) and w.eval() == ("eval", True)
    w.observe(10.0)
    assert w.train() == ("train", False) and w.eval(1024) == ("eval", False)
    assert len(built) == 4  # the warm-up built every program; the switches built nothing

    same = _AttentionVariants(make("train"), make("eval"), False, 1024, logged.append)
    same.observe(ops.SHIFT_LIMIT * 2)
    assert same.train() == ("train", False) and same.switches == 0
    assert same.warm_up(lambda: None, lambda window: None, [(1024, "4x1024")], lambda: None) == [
        "train step T=1024", "eval step 4x1024"]


@pytest.mark.slow
def test_a_switch_of_the_attention_forward_mid_run_compiles_nothing(byte_data, tmp_path, monkeypatch):
    """Where the two qk_attention forwards are different programs (made so here: on the reference path each
    forward's steps are still their own jitted programs), the untimed warm-up runs the train step of both and
    the eval step of both at every eval window the run uses (train.seq_len; eval.seq_len for the round trip;
    eval.batch_seqs windows of it for the sliding line). The forward switching mid-run (the bound the host
    reads forced over the limit after steps 2 and 4, under it after step 3) and the final pipeline, its
    score-first test-time training included (its scoring step, the exact-max eval step at train.seq_len, and its
    SGD step at both row counts), then compile nothing: XLA compilations counted through jax.monitoring from the
    end of the warm-up. The run's TTT log obeys score-before-update, and `evaluate --ttt --artifact` (the same
    weights, the same protocol) reproduces its legal_ttt score."""
    from jax import monitoring

    from frontier_jax import ops
    from frontier_jax.run import driver
    from frontier_jax.trainer import _AttentionVariants

    compiled, mark, over = [], [], {"limit": False}

    def count(event, seconds, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(kw.get("fun_name"))

    def warm_up(policy, t):
        seconds = real_warm_up(policy, t)
        mark.append(len(compiled))
        return seconds

    def observe(self, bound):
        real_observe(self, 2 * ops.SHIFT_LIMIT if over["limit"] else bound)

    real_warm_up, real_observe = driver.warm_up, _AttentionVariants.observe
    monkeypatch.setattr(driver, "warm_up", warm_up)
    monkeypatch.setattr(_AttentionVariants, "observe", observe)
    monkeypatch.setattr(ops, "attention_variants_differ", lambda: True)
    # TTT: 5,888 targets in 4 chunks of 1,536 (24 rows each: SGD steps of 16 and 8 rows), stride 32 over windows of 64
    cfg = tiny_config(byte_data, "eval.seq_len=128", "eval.stride=32", "eval.batch_seqs=8", "ttt.enabled=True",
                      "ttt.chunk_tokens=1536", "ttt.batch_seqs=16", "ttt.epochs=1", "ttt.lr=0.01", "eval.score='ttt'")
    monitoring.register_event_duration_secs_listener(count)
    try:
        summary = trainer.run(cfg, tmp_path / "run", echo=False,
                              on_step=lambda step, row: over.update(limit=step in (2, 4, 5)))
    finally:
        monitoring.unregister_event_duration_listener(count)
    assert compiled[mark[0]:] == []  # nothing compiled after the warm-up
    assert summary["attention_forward_switches"] == 3 and summary["attention_forward"].startswith("exact max")
    assert summary["final_complete"] and np.isfinite(summary["sliding_val_bpb"])
    log = (tmp_path / "run" / "train.log").read_text()
    programs = [f"train step T=64 ({f})" for f in ("bounded shift", "exact max")] + [
        f"eval step {w} ({f})" for w in ("4x64", "4x128", "8x128") for f in ("bounded shift", "exact max")] + [
        "ttt score step 8x64", "ttt train step 16x64", "ttt train step 8x64"]
    assert f"compile warm-up: 11 programs: {', '.join(programs)}" in log and "compile warm-up: 11 programs, " in log
    assert len(compiled[:mark[0]]) >= 10  # (the TTT score step 8x64 is the exact eval step of that shape: new)

    from frontier_jax.evaluate import evaluate_run
    from frontier_jax.submission import evidence

    order = evidence.ttt_order(evidence.read_ttt_log(tmp_path / "run"))
    assert order.chunks == 4 and order.events == 4 + 3 * 2 and not order.order_violations + order.pass_violations
    assert summary["score"]["line"] == "legal_ttt" and summary["ttt_val_tokens"] == summary["sliding_val_tokens"]
    assert "ttt_sliding:start chunks=4 chunk_tokens=1536 total_windows=" in log and "\nlegal_ttt_exact val_loss:" in log
    again = evaluate_run(tmp_path / "run", artifact=tmp_path / "run" / "final_model.int8.ptz", ttt=True)
    assert again["nll_sum_nats"] == pytest.approx(summary["ttt_val_nll_sum_nats"], rel=1e-9)
    assert (again["tokens"], again["bytes"]) == (summary["ttt_val_tokens"], summary["ttt_val_bytes"])
    assert again["ttt"]["sgd_steps"] == 6 and again["ttt"]["chunks"] == 4


@pytest.mark.slow
def test_a_run_stopped_in_its_final_steps_is_finished_by_resume(byte_data, tmp_path):
    """SIGTERM once the final validation is recorded (sent from inside the artifact's round trip, after the
    "(final)" checkpoint): exit 130, a summary that says the final steps did not complete; `--resume` then
    runs only the missing stages (the artifact, its round trip and sliding windows), trains nothing, and
    writes the complete summary, whose round-trip and sliding scores `evaluate --artifact` reproduces. The
    record's pipeline at a shape where its int6 branch runs (MLP matrices of 131,072 elements)."""
    import os
    import subprocess
    import sys

    from helpers import REPO, TINY_OVERRIDES
    from frontier_jax.evaluate import evaluate_run

    run = tmp_path / "run"
    sets = [*TINY_OVERRIDES, "model.model_dim=256", "train.max_steps=3", "eval.artifact='int6_lzma'",
            "eval.seq_len=128", "eval.stride=32", "eval.score='sliding'"]
    args = ["--config", str(REPO / "configs" / "tiny.py"), "--data", str(byte_data), "--tokenizer", "bytes",
            "--out", str(run), *[a for s in sets for a in ("--set", s)]]
    stop = ("import os, signal, sys; from frontier_jax.interop import artifact; real = artifact.roundtrip\n"
            "def roundtrip(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return real(*a, **k)\n"
            "artifact.roundtrip = roundtrip\nfrom frontier_jax.train import main\nsys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.run([sys.executable, "-c", stop, *args], cwd=REPO, capture_output=True, text=True, env=env,
                           timeout=600)
    assert first.returncode == 130, first.stderr[-2000:]
    assert "(final)" in first.stdout and f"its final steps run with: python -m frontier_jax.train --resume {run}" \
        in first.stderr
    cut = json.loads((run / "summary.json").read_text())
    assert cut["stop_reason"] == "signal SIGTERM during the final validation" and not cut["final_complete"]
    assert set(json.loads((run / "final_steps.json").read_text())["stages"]) == {"val"}
    second = subprocess.run([sys.executable, "-m", "frontier_jax.train", "--resume", str(run)], cwd=REPO,
                            capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["final_complete"] and s["stop_reason"] == "max_steps" and s["steps"] == 3 and s["val_bpb"] == cut["val_bpb"]
    assert s["artifact_tensors"]["int6"] == 4 and s["score"]["line"] == "final_int6_sliding_window"
    log = (run / "train.log").read_text()
    assert "final steps recorded by an earlier invocation: val; running the rest" in log
    assert "compile warm-up" not in log.split("final steps did not complete")[1]  # nothing trained after the cut
    train, _ = _train_rows(run)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert f"final_int6_sliding_window_exact val_loss:{s['sliding_val_loss']:.8f} val_bpb:{s['sliding_val_bpb']:.8f}" \
        in second.stdout
    art = run / "final_model.int6.ptz"
    assert evaluate_run(run, artifact=art)["bpb"] == s["roundtrip_val_bpb"]
    assert evaluate_run(run, artifact=art, stride=32)["nll_sum_nats"] == s["sliding_val_nll_sum_nats"]
    again = trainer.run(tiny_config(byte_data, *sets[len(TINY_OVERRIDES):]), run, resume=True, echo=False)
    assert again["stop_reason"] == "already finished"


def test_a_signal_in_the_set_up_stops_before_the_model_is_built(byte_data, tmp_path, monkeypatch):
    """`--set model.num_layers=1000000` ignored SIGTERM for 13 minutes: the set-up checks the stop flag between its
    phases, so a signal before the model is built stops there (exit 130's summary; no run directory)."""
    import os
    import signal

    real = trainer.ngram_runtime.for_config

    def signalled(*args, **kw):  # the signal arrives during the phase before the model is built
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kw)

    monkeypatch.setattr(trainer.ngram_runtime, "for_config", signalled)
    monkeypatch.setattr(trainer, "init_state", lambda *a, **k: pytest.fail("the model was built after the signal"))
    out = tmp_path / "run"
    summary = trainer.run(tiny_config(byte_data), out, echo=False)
    assert summary["stop_reason"] == "signal SIGTERM before training" and not out.exists()


# the record's optimizer and averaging on a tiny recipe model (BigramHash and value-embedding projections, the two
# layers late QAT fake-quantizes); steps-mode warmdown over the whole run: lr scale (8 - s) / 8, so SWA takes the
# weights after steps 6 and 8 (scale < 0.5, every 2) and late QAT switches on before step 7 (scale 0.25 < 0.3)
RECORD_OPTIM = ("train.max_steps=8", "optim.warmdown_mode='steps'", "optim.warmdown_steps=8",
                "model.bigram_buckets=64", "model.bigram_dim=32", "model.ve_layers=(1,)", "model.ve_dim=16",
                "optim.muon_weight_decay=0.04", "optim.adam_weight_decay=0.04", "optim.grad_clip_norm=0.3",
                "optim.muon_momentum_dtype='bfloat16'", "optim.muon_shape_scale='lr'", "optim.ema_decay=0.9",
                "optim.swa_every=2", "optim.swa_threshold=0.5", "optim.late_qat_threshold=0.3")


def _train_state(run_dir):
    """(params, opt_state) of a run's newest checkpoint, as the trainer holds them."""
    from frontier_jax import optim
    from frontier_jax.interop.state_dict import abstract_state, read_run_config

    cfg, dtypes = read_run_config(run_dir)
    _, aparams, aopt = abstract_state(cfg, dtypes.compute, optim.build_optimizer(cfg.optim, dtypes.muon_ns))
    state, _ = checkpoint.restore(run_dir, {"params": aparams, "opt_state": aopt})
    return state["params"], state["opt_state"]


@pytest.mark.slow
def test_kill_and_resume_restores_ema_swa_and_late_qat_bit_identically(byte_data, tmp_path):
    """A run with weight decay, clipping, bf16 momentum, EMA, SWA and late QAT, stopped after step 7 (late QAT
    on, one SWA snapshot taken) and resumed: the same losses, the same switch step, and the final checkpoint's
    parameters, EMA and SWA state bit for bit; the final evaluation, the artifact and `restore_params` (evaluate,
    export) use the EMA."""
    from frontier_jax import optim
    from frontier_jax.interop import artifact
    from frontier_jax.interop.state_dict import params_to_state_dict

    full = trainer.run(tiny_config(byte_data, *RECORD_OPTIM), tmp_path / "full", echo=False)
    part = trainer.run(tiny_config(byte_data, *RECORD_OPTIM), tmp_path / "split", echo=False, stop_after_steps=7)
    assert part["steps"] == 7 and part["late_qat_step"] == 6 and part["swa_count"] == 1
    resumed = trainer.run(tiny_config(byte_data, *RECORD_OPTIM), tmp_path / "split", resume=True, echo=False)
    assert resumed["late_qat_step"] == full["late_qat_step"] == 6  # restored, not switched again at step 7
    assert resumed["swa_count"] == full["swa_count"] == 2
    a, _ = _train_rows(tmp_path / "full")
    b, _ = _train_rows(tmp_path / "split")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    (pa, sa), (pb, sb) = _train_state(tmp_path / "full"), _train_state(tmp_path / "split")
    for x, y in zip(jax.tree_util.tree_leaves((pa, sa)), jax.tree_util.tree_leaves((pb, sb))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert isinstance(sa, optim.AveragedState) and int(sa.swa.count) == 2 and int(sa.swa.step) == 8
    ema = restore_params(tmp_path / "full")[2]  # what evaluate and export see: the EMA, not the trained weights
    for e, x, p in zip(*(jax.tree_util.tree_leaves(t) for t in (ema, sa.ema, pa))):
        np.testing.assert_array_equal(np.asarray(e), np.asarray(x).astype(p.dtype))
    assert not all(np.array_equal(np.asarray(e), np.asarray(p)) for e, p in zip(jax.tree_util.tree_leaves(ema),
                                                                                jax.tree_util.tree_leaves(pa)))
    log = (tmp_path / "full" / "train.log").read_text()
    assert "late QAT on from step 7" in log and "final evaluation on the post_ema weights" in log
    # the artifact is the EMA's: quantizing the EMA again writes the same bytes
    mine = tmp_path / "from_ema"
    mine.mkdir()
    fmt = tiny_config(byte_data, *RECORD_OPTIM).eval.artifact
    artifact.roundtrip(params_to_state_dict(jax.device_get(ema)), mine, fmt)
    assert artifact.artifact_path(mine, fmt).read_bytes() == artifact.artifact_path(tmp_path / "full", fmt).read_bytes()
    assert resumed["val_nll_sum_nats"] == full["val_nll_sum_nats"]
