"""baseline_torch.train: it loads no JAX (importing it, nor training with it), follows the shared run
policy (stop reason, exit code, metrics rows) and refuses bad input before writing anything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")

from helpers import REPO, TINY_OVERRIDES  # noqa: E402

NO_JAX = ("bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'orbax')]; "
          "assert not bad, bad")


def test_importing_the_torch_trainer_loads_no_jax():
    subprocess.run([sys.executable, "-c", "import baseline_torch.train, sys; " + NO_JAX], cwd=REPO, check=True,
                   timeout=120)


@pytest.mark.slow
def test_a_whole_torch_run_loads_no_jax_and_follows_the_run_policy(byte_data, tmp_path):
    out = tmp_path / "run"
    sets = [s for o in TINY_OVERRIDES for s in ("--set", o)]
    argv = ["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
            "--threads", "1", "--device", "cpu", *sets, "--set", "train.max_steps=3", "--set", "train.val_every_steps=2",
            "--set", "train.log_every_steps=1"]
    code = f"import sys; from baseline_torch.train import main; rc = main({argv!r}); {NO_JAX}; sys.exit(rc)"
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    last = p.stdout.strip().splitlines()[-3:]  # the plain score, then the official script's two round-trip lines
    tag = " rules:trainium-frontier"  # the run's rules profile ends every score line (docs/rules.md)
    assert last[0] == f"val_bpb: {summary['val_bpb']:.6f}{tag}"
    assert last[1].startswith(f"final_int8_zlib_roundtrip val_loss:{summary['roundtrip_val_loss']:.4f} "
                              f"val_bpb:{summary['roundtrip_val_bpb']:.4f} eval_time:") and last[1].endswith(tag)
    assert last[2] == (f"final_int8_zlib_roundtrip_exact val_loss:{summary['roundtrip_val_loss']:.8f} "
                       f"val_bpb:{summary['roundtrip_val_bpb']:.8f}{tag}")
    assert (out / "code.json").is_file() and summary["rules_profile"] == "trainium-frontier"
    assert summary["artifact_bytes"] == (out / "final_model.int8.ptz").stat().st_size
    assert summary["submission_bytes"] == summary["artifact_bytes"] + summary["code_bytes"] > 0
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 3 and summary["implementation"] == "torch"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("train", 1), ("train", 2), ("val", 2), ("train", 3), ("val", 3),
                                                      ("roundtrip", 3)]
    assert rows[-2]["final"] is True and "final" not in rows[2]
    assert all(r["tokens_per_second"] > 0 and r["loadavg_1m"] >= 0 for r in rows if r["kind"] == "train")
    log = (out / "train.log").read_text()
    assert "compile warm-up" in log and "step 2 val loss" in log
    assert "step 3/3 | 1,536 tokens | " in log and "train split: 60,000 tokens" in log  # progress off a terminal
    assert f"run directory       {out}" in p.stdout
    env = json.loads((out / "env.json").read_text())
    assert env["backend"] == "torch-cpu" and env["host_allocator"]["requested"] == "auto"


def test_bad_initial_weights_are_refused_in_one_line_before_anything_is_written(byte_data, tmp_path, capsys):
    from baseline_torch.train import main

    out = tmp_path / "run"
    sets = [s for o in TINY_OVERRIDES for s in ("--set", o)]
    rc = main(["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
               "--threads", "1", "--device", "cpu", "--init-weights", str(tmp_path / "missing.npz"), *sets])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "missing.npz" in err
    assert not out.exists()


@pytest.mark.parametrize("spoil, message", [
    (lambda sd: sd.update({"tok_emb.weight": sd["tok_emb.weight"].astype("int8")}), "has dtype int8; parameters must be"),
    (lambda sd: sd["blocks.0.attn.c_q.weight"].__setitem__((0, 0), float("nan")), "holds non-finite values"),
])
def test_init_weights_are_checked_as_interop_import_checks_them(byte_data, tmp_path, capsys, spoil, message):
    """`--init-weights` skipped `interop import`'s dtype and NaN checks: an int8 npz trained from a zero embedding
    (exit 0), a NaN npz exited 3 blaming divergence. Both trainers share one validator (interop.npz.check_weights)."""
    import torch

    from baseline_torch.model import GPT, state_dict_numpy
    from baseline_torch.train import main
    from frontier_jax.interop import npz
    from helpers import tiny_config

    sd = state_dict_numpy(GPT(tiny_config(byte_data).model, torch.float32))
    spoil(sd)
    npz.save_npz(tmp_path / "w.npz", sd)
    out = tmp_path / "run"
    sets = [s for o in TINY_OVERRIDES for s in ("--set", o)]
    rc = main(["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
               "--threads", "1", "--device", "cpu", "--init-weights", str(tmp_path / "w.npz"), *sets])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"{tmp_path / 'w.npz'}: key " in err and message in err, err
    assert not out.exists()


def _refused(byte_data, out, capsys, setting: str) -> str:
    """The one-line error of a torch run with `setting` (exit 2, no run directory)."""
    from baseline_torch.train import main

    sets = [s for o in (*TINY_OVERRIDES, setting) for s in ("--set", o)]
    try:
        rc = main(["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
                   "--device", "cpu", *sets])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and not out.exists()
    return err


def test_ngram_and_ttt_enabled_are_refused_not_ignored(byte_data, tmp_path, capsys):
    """Round 3: the PyTorch baseline ignored ngram.enabled silently (another model than the config names); nor does
    it skip a test-time training stage the config asks for."""
    assert "ngram.enabled=True: the PyTorch baseline has no" in _refused(byte_data, tmp_path / "run", capsys,
                                                                         "ngram.enabled=True")
    assert "ttt.enabled=True: the PyTorch baseline has no test-time training" in _refused(
        byte_data, tmp_path / "run", capsys, "ttt.enabled=True")


def test_the_eval_section_the_torch_baseline_runs_and_the_artifact_it_refuses(byte_data, tmp_path, capsys):
    """The PyTorch baseline scores the round trip at eval.seq_len and sliding windows at eval.stride with the same
    windows as the JAX trainer (every target once); an int6+lzma artifact, which it does not write, is refused."""
    import numpy as np
    import torch

    from baseline_torch.train import Trainer
    from frontier_jax.data.dataset import load_for_config
    from frontier_jax.data.stream import TrainLoader
    from helpers import tiny_config

    assert "eval.artifact='int6_lzma': the PyTorch baseline writes" in _refused(byte_data, tmp_path / "run", capsys,
                                                                               "eval.artifact='int6_lzma'")
    cfg = tiny_config(byte_data, "eval.seq_len=128", "eval.stride=32", "eval.batch_seqs=8")
    data = load_for_config(cfg)
    assert (data.val_tokens.size - 1) % 128 == 0  # cut to whole windows of the longer length
    t = Trainer(cfg, torch.device("cpu"), TrainLoader(data.train_files, 64), data.val_tokens, data.tables)
    with torch.no_grad():  # weights that read their context (at init the zero output projections do not)
        for p in t.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (two shared cores: more threads only contend)
    try:
        sliding, rt = t.eval_sums(0, seq_len=128, stride=32), t.eval_sums(0, seq_len=128)
    finally:
        torch.set_num_threads(threads)
    assert sliding["tokens"] == rt["tokens"] == data.val_tokens.size - 1 and sliding["bytes"] == rt["bytes"]
    assert np.isfinite(sliding["nll_sum_nats"]) and sliding["nll_sum_nats"] != rt["nll_sum_nats"]


def test_a_config_with_recipe_switches_is_refused_in_one_line(byte_data, tmp_path, capsys):
    """The PyTorch port is the baseline's: configs/record11_tiny.py (the recipe's switches and optimizer settings) is
    refused, naming them, before anything is written; the model class refuses them too."""
    from baseline_torch.model import GPT
    from baseline_torch.train import main
    from frontier_jax.config import ConfigError, ModelConfig

    out = tmp_path / "run"
    try:
        rc = main(["--config", "configs/record11_tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out",
                   str(out), "--device", "cpu", "--set", "model.vocab_size=260"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "baseline_torch implements the baseline only" in err
    assert "model.mlp_negative_slope=0.5" in err and "model.xsa_last_n=2" in err and not out.exists()
    assert "optim.muon_weight_decay=0.04" in err and "optim.ema_decay=0.997" in err  # the record's optimizer too
    with pytest.raises(ConfigError, match="model.ln_scale=True"):
        GPT(ModelConfig(num_layers=2, model_dim=64, ln_scale=True))
    GPT(ModelConfig(num_layers=1, model_dim=64, mlp_mult=2.5))  # a non-integer mlp_mult is a shape, not a switch
