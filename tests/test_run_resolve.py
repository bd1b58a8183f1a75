"""Run resolution (frontier_jax.run.resolve): the CLIs' options as keywords -> config, run directory, resume, demo."""

from __future__ import annotations

import json

import pytest

from helpers import REPO
from frontier_jax.config import to_dict
from frontier_jax.run.resolve import resolve_run
from frontier_jax.run.rundir import CONFIG, RunError

TINY = str(REPO / "configs" / "tiny.py")


def test_options_become_overrides_in_order_and_the_out_dir_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, out, resume, demo = resolve_run(config=TINY, data="shards", tokenizer="bytes", budget=12.5, seed=3,
                                         kernels="reference", sets=["train.seed=4"], out_tag="-torch")
    assert cfg.data.data_dir == str(tmp_path / "shards") and cfg.data.tokenizer == "bytes"
    assert cfg.train.budget_seconds == 12.5 and cfg.train.kernels == "reference"
    assert cfg.train.seed == 3  # the options come after --set
    assert not resume and not demo and out.parent.name == "runs" and out.name.startswith(f"{cfg.name}-torch-")
    assert resolve_run(config=TINY, data="d", out="here").out_dir.name == "here"


def test_resume_takes_the_runs_own_config_and_refuses_another_out(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RunError, match="not a run directory"):
        resolve_run(resume=str(run))
    run.mkdir()
    saved = resolve_run(config=TINY, data="d", sets=["model.num_layers=3"]).config
    (run / CONFIG).write_text(json.dumps(to_dict(saved)))
    r = resolve_run(resume=str(run), budget=99.0)
    assert r.resume and r.out_dir == run and r.config.model.num_layers == 3 and r.config.train.budget_seconds == 99.0
    with pytest.raises(RunError, match="continues the run in place"):
        resolve_run(resume=str(run), out=str(tmp_path / "elsewhere"))
