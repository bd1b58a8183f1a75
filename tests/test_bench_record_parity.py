"""bench/record_parity.py and bench/record_script.py without the record's script (it is not in the repository): the
import's stand-ins and environment on a fake script, the record's initial state through the pg-record import, the
environment a config gives the script, the comparison, report and JSON line, and bad input. The end-to-end run
needs the user's copy of the record (`python -m bench.record_parity --record PATH/train_gpt.py ...`, its numbers
in docs/recipe.md)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import numpy as np
import pytest

from bench import record_parity, record_script
from frontier_jax.errors import BadInput
from frontier_jax.interop import pg_record
from helpers import exit_code

torch = pytest.importorskip("torch")

FAKE = '''
import os
import torch
from flash_attn_interface import flash_attn_func
class Hyperparameters:
    seed = int(os.environ.get("SEED", 1337))
    run_id = os.environ.get("RUN_ID", "unset")
def compiled(f):
    return torch.compile(f)
def doubled(x):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=True):
        return x * 2
def synced():
    torch.cuda.synchronize()
    return torch.cuda.is_available()
def attention(q, k, v):
    return flash_attn_func(q, k, v, causal=True)
'''


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "train_gpt.py"
    path.write_text(textwrap.dedent(FAKE))
    return path


def test_the_import_sets_exactly_the_given_environment_and_puts_the_process_one_back(fake, monkeypatch):
    monkeypatch.setenv("RUN_ID", "outside")
    monkeypatch.delenv("SEED", raising=False)
    mod = record_script.load(fake, {"SEED": "7"}, name="fake_record_env")
    assert mod.Hyperparameters.seed == 7 and mod.Hyperparameters.run_id == "unset"  # not the process's RUN_ID
    import os

    assert os.environ["RUN_ID"] == "outside" and "SEED" not in os.environ
    with pytest.raises(BadInput, match="does not read NUM_LAYERS"):
        record_script.load(fake, {"NUM_LAYERS": "2"}, name="fake_record_bad")
    with pytest.raises(BadInput, match="not found"):
        record_script.load(fake.parent / "missing.py", {})


def test_the_stand_ins_are_identity_compile_fp32_no_cuda_and_sdpa_for_flash_attention(fake):
    mod = record_script.load(fake, {}, name="fake_record_standins")
    f = lambda x: x + 1
    assert mod.compiled(f) is f
    assert mod.doubled(torch.ones(2)).dtype == torch.float32 and mod.synced() is False
    g = torch.Generator().manual_seed(0)
    B, T, H, G, K = 2, 5, 4, 2, 8
    q, k, v = (torch.randn(B, T, n, K, generator=g) for n in (H, G, G))
    got = mod.attention(q, k, v)
    # explicit causal softmax attention, query head h reading kv head h // (H / G) (FA3's GQA rule)
    kk, vv = (t.repeat_interleave(H // G, dim=2) for t in (k, v))
    s = torch.einsum("bthk,bshk->bhts", q, kk) / K ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    want = torch.einsum("bhts,bshk->bthk", s.softmax(-1), vv)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_scripts_environment_is_the_parity_configs(tmp_path):
    cfg = record_parity.parity_config(record_parity.DEFAULT_CONFIG, 5, 7, ["optim.swa_every=1"])
    env = record_parity.record_environment(cfg, tmp_path, tmp_path / "t.model")
    assert set(env) <= set(pg_record.RECORD_ENV_DEFAULTS)
    assert (env["ITERATIONS"], env["WARMDOWN_ITERS"], env["MAX_WALLCLOCK_SECONDS"], env["SWA_EVERY"]) == ("5", "7", "0",
                                                                                                        "1")
    assert (env["MUON_WD"], env["ADAM_WD"], env["GRAD_CLIP_NORM"], env["LATE_QAT_THRESHOLD"]) == ("0.04", "0.04", "0.3",
                                                                                                 "0.15")
    assert (env["NUM_LAYERS"], env["MODEL_DIM"], env["TRAIN_BATCH_TOKENS"], env["DATA_PATH"]) == (
        "4", "128", "4096", str(tmp_path))
    back, _ = pg_record.config_from_env(env)  # the script builds the parity config's model and optimizer
    assert back.model == dataclasses.replace(cfg.model, embed_dtype="bfloat16", compute_dtype=back.model.compute_dtype)
    assert back.optim == cfg.optim


def test_the_records_state_dict_is_imported_as_interop_import_reads_it(tmp_path):
    """A record-format state dict of the parity config's model (bf16 tables, banked) through the pg-record import:
    the same values in our parameters."""
    import jax
    from flax import nnx

    from frontier_jax.interop.state_dict import params_to_state_dict, record_state_dict
    from frontier_jax.model import build

    cfg = record_parity.parity_config(record_parity.DEFAULT_CONFIG, 2, 4)
    bf16_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, embed_dtype="bfloat16"))
    params = nnx.split(build(bf16_cfg, "float32"))[1]
    state = {k: torch.from_numpy(np.asarray(v, np.float32)).to(torch.bfloat16 if v.dtype != np.float32 else
                                                                torch.float32)
             for k, v in record_state_dict(jax.device_get(params), bf16_cfg).items()}
    _, imported = record_parity.import_record_state(state, cfg, tmp_path)
    a, b = params_to_state_dict(jax.device_get(imported)), params_to_state_dict(jax.device_get(params))
    assert set(a) == set(b) and all(np.array_equal(a[k], np.asarray(b[k], np.float32)) for k in a)
    assert all(v.dtype == np.float32 for v in a.values())  # the parity config's fp32 tables


def _result(loss_rel=1e-4, rms=2e-3, ttt_rel=1e-5):
    ref = [6.9, 6.6, 6.3]
    ttt = {"ours": 3.9 * (1 + ttt_rel), "record": 3.91, "record_once": 3.9, "targets": 16384, "chunks": 4,
           "qat": {"ours": True, "record": True}, "scored": {"ours": 16384, "record": 16576, "record_once": 16384},
           "record_recorded_abs_diff": 0.0}
    return {"ours": {"loss": [x * (1 + loss_rel) for x in ref], "grad_norm": [0.4, 0.8, 1.0], "qat": [0, 0, 1]},
            "record": {"loss": ref, "grad_norm": [0.4, 0.81, 1.0], "qat": [0, 0, 1]}, "param_rel_rms": rms,
            "ema_rel_rms": 1e-5, "ttt": ttt, "worst": {"param": ["w", 0.1], "ema": ["w", 0.05]},
            "swa_count": {"ours": 1, "record": 1}, "same_windows": [True, False, False], "config": "c", "steps": 3}


def test_the_report_the_json_line_and_the_verdict():
    ok, bad = _result(), _result(loss_rel=2e-3, rms=0.02, ttt_rel=2e-3)
    assert record_parity.verdict(ok) == []
    failures = record_parity.verdict(bad)
    assert len(failures) == 5 and failures[0].startswith("step 1: loss") and "relative RMS" in failures[-2]
    assert failures[-1].startswith("ttt: bpb")  # against the record's pass with each target once, not as it is
    text = record_parity.format_report(ok)
    assert "| 3 | 6.3006300 | 6.3000000 | 1.0e-04 |" in text and "acceptance" in text and "met" in text
    assert "ours 3.90003900" in text and "record 3.91000000 (its eval_val_sliding_ttt as it is" in text
    assert "NOT met" in record_parity.format_report(bad)
    line = json.loads(record_parity.to_json(ok))
    assert set(line) == {"ours", "record", "param_rel_rms", "ema_rel_rms", "ttt", "worst"}
    assert line["ttt"]["ours"] == ok["ttt"]["ours"] and line["ttt"]["record_once"] == 3.9
    untrained = {**ok, "ttt": None}  # --ttt-tokens 0
    assert record_parity.verdict(untrained) == [] and "ttt: not scored" in record_parity.format_report(untrained)
    assert set(line["ours"]) == {"loss", "grad_norm"} and line["record"]["grad_norm"][1] == 0.81
    rms, worst, worst_rel = record_parity.rel_rms({"a": np.ones(4) * 1.1, "b": np.zeros(2)},
                                                  {"a": np.ones(4), "b": np.zeros(2)})
    assert rms == pytest.approx(0.1) and (worst, worst_rel) == ("a", pytest.approx(0.1))


def test_the_records_ttt_windows_cover_every_target_and_its_tail_re_scores_the_last_stride():
    """The script's TTT windows (train_gpt.py:1087-1099) in its scoring order: chunk by chunk, every target scored,
    the last T / stride - 1 windows re-scoring the last stride targets, which the exactly-once count drops."""
    n, T, stride, chunk = 2048, 256, 64, 512
    windows = record_script.ttt_windows(n, T, stride, chunk)
    covered = np.zeros(n, int)
    for ws, wlen, s in windows:
        covered[ws + s:ws + wlen] += 1
    assert covered.min() == 1 and covered[:n - stride].max() == 1
    assert set(covered[n - stride:]) == {T // stride}  # the tail: T / stride - 1 extra scorings
    chunks = [min((ws + s) // chunk, n // chunk - 1) for ws, _, s in windows]
    assert chunks == sorted(chunks) and len(set(chunks)) == n // chunk


def test_bad_input_is_one_line_exit_2(fake, tmp_path, capsys):
    tok = tmp_path / "t.model"
    tok.write_bytes(b"")
    base = ["--data", str(tmp_path), "--tokenizer", str(tok), "--steps", "1"]
    assert exit_code(record_parity.main, ["--record", str(tmp_path / "missing.py"), *base]) == 2
    assert exit_code(record_parity.main, ["--record", str(fake), *base]) == 2  # a script that reads none of it
    assert exit_code(record_parity.main, ["--record", str(fake), *base[:2], "--tokenizer", str(fake),
                                          "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "missing.py: the record's train_gpt.py not found" in err[0]
    assert "does not read" in err[1] and "not a SentencePiece .model file" in err[2]


def test_the_docs_parity_section_is_one_run_of_the_bench_that_meets_the_acceptance():
    """docs/recipe.md's parity numbers: its command is the bench's (its own argument parser reads it), the table's
    loss and gradient-norm cells and the averages lines are what the bench prints for the JSON line quoted beside
    them (one run's output, not edited), and that run meets the acceptance."""
    import re
    import shlex

    from helpers import REPO

    section = (REPO / "docs" / "recipe.md").read_text().split("## Step-for-step parity with the record", 1)[1]
    section = section.split("\n## ", 1)[0]
    command = next(line for line in section.splitlines() if line.startswith("python -m bench.record_parity"))
    args = record_parity.parser().parse_args(shlex.split(command)[3:])
    assert args.json and args.steps == 5 and args.config == str(record_parity.DEFAULT_CONFIG) and not args.set
    res = json.loads(next(line for line in section.splitlines() if line.startswith('{"ours"')))
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(res["ours"]["loss"]) == len(res["record"]["loss"]) == args.steps
    for i, row in enumerate(rows):
        assert [c.strip() for c in row.strip("|").split("|")][:7] == record_parity.step_cells(res, i)
    for line in record_parity.averages_lines(res):
        assert line in section
    assert res["ttt"] is not None and args.ttt_tokens == record_parity.DEFAULT_TTT_TARGETS
    for line in record_parity.ttt_lines(res):
        assert line in section
    assert record_parity.verdict(res) == []  # the TTT scores within 1e-3 relative too
