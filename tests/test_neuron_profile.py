"""`python -m frontier_jax.profile`: a timeline PNG per kernel call and each engine's active share."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier_jax.neuron import profile
from frontier_jax.config import load_config
from kernels_nki.emulator import timing

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_cfg(tmp_path):
    cfg = tmp_path / "small.py"
    cfg.write_text(
        "import dataclasses\nfrom frontier_jax.config import apply_overrides, load_config\n"
        "def get_config():\n"
        f"    cfg = apply_overrides(load_config({str(REPO / 'configs' / 'tiny.py')!r}), ['model.num_layers=2', "
        "'model.num_kv_heads=1', 'model.model_dim=96', 'model.num_heads=3'])\n"
        "    return dataclasses.replace(cfg, name='small', train=dataclasses.replace(cfg.train, seq_len=50, "
        "tokens_per_step=600, micro_batch_seqs=3))\n")
    return str(cfg)


def test_profile_writes_a_timeline_and_prints_the_shares(small_cfg, tmp_path, capsys):
    out = tmp_path / "prof"
    assert profile.main(["--op", "projection", "--config", small_cfg, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["projection_bwd.png", "projection_fwd.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out.iterdir())
    text = capsys.readouterr().out
    assert "projection_fwd" in text and "dma" in text and "->" in text


def test_lanes_and_shares_of_a_call(small_cfg):
    from frontier_jax.neuron import kernel_calls as kc
    call = next(c for c in kc.kernel_calls(load_config(small_cfg)) if c.op == "qk_attention")
    s = profile.schedule_call(call)
    lanes = profile.lanes(s)
    assert list(lanes)[:4] == list(timing.LANES) and len(lanes) == 4 + 16
    sh = profile.shares(s)
    assert all(0 <= v <= 1 + 1e-9 for v in sh.values()) and sh["dma"] >= max(sh[f"dma{i}"] for i in range(16)) - 1e-9
    assert sum(len(b) for b in lanes.values()) >= len(s.instrs)  # a DMA is a bar on each of its engines


def test_unknown_op_is_a_clear_error(small_cfg, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        profile.main(["--op", "nope", "--config", small_cfg, "--out", str(tmp_path / "p")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--op nope: not called by config small" in err and not (tmp_path / "p").exists()


def test_qk_attention_is_said_to_be_one_sequence_of_its_call(small_cfg, tmp_path, capsys):
    """profile draws one sequence of a qk_attention call; its output says so, and that kernel_report prices the
    whole call (the two figures differ by about the call's sequences)."""
    assert profile.main(["--op", "qk_attention", "--config", small_cfg, "--out", str(tmp_path / "p")]) == 0
    text = capsys.readouterr().out
    assert "(one sequence of 3)" in text and "kernel_report prices the whole call" in text
