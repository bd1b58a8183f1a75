"""The PyTorch baseline (baseline_torch) against the JAX model, in float32 (NS in float32 too).

Same weights (moved through the interop state_dict mapping) -> same per-token losses and logits
(relative 1e-5); one optimizer step (Muon and both Adam groups) -> same parameters (Frobenius-relative
1e-5 per tensor); 20 steps on identical batches -> losses within 1e-3. Plus the torch trainer's run
directory and its interop .npz round trip.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from baseline_torch.model import GPT as TorchGPT  # noqa: E402
from baseline_torch.model import load_state_numpy, state_dict_numpy  # noqa: E402
from baseline_torch.optim import Optimizers  # noqa: E402
from helpers import TINY_OVERRIDES  # noqa: E402
from frontier_jax.interop import npz, state_dict  # noqa: E402
from frontier_jax import optim as jax_optim  # noqa: E402
from frontier_jax.policies import schedules  # noqa: E402
from frontier_jax.config import ModelConfig, OptimConfig  # noqa: E402
from frontier_jax.model import GPT as JaxGPT  # noqa: E402
from frontier_jax.steps import make_train_step  # noqa: E402

torch.set_num_threads(1)  # two shared cores: one thread avoids OpenMP oversubscription stalls

# 3 layers: one encoder and two decoder blocks, so the unpaired decoder block (no skip) is exercised.
MC = ModelConfig(vocab_size=128, num_layers=3, model_dim=64, num_heads=4, num_kv_heads=2, mlp_mult=2,
                 compute_dtype="float32")
OC = OptimConfig(muon_ns_dtype="float32", muon_momentum_warmup_steps=10)
B, T = 4, 64


def _jax_model(seed: int = 0):
    model = JaxGPT(MC, rngs=nnx.Rngs(seed), compute_dtype=jnp.float32)
    return nnx.split(model)


def _randomised_state_dict(params, seed: int = 1) -> dict[str, np.ndarray]:
    """The JAX init with every tensor (zero-init projections, scales, gains included) perturbed, so
    every parameter takes part in the forward pass and receives a gradient."""
    rng = np.random.default_rng(seed)
    sd = state_dict.params_to_state_dict(params)
    return {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in sd.items()}


@pytest.fixture(scope="module")
def jax_step():
    """(graphdef, tx, jitted train step) shared by the optimizer tests, so the step compiles once."""
    graphdef, _ = _jax_model()
    tx = jax_optim.build_optimizer(OC)
    return graphdef, tx, make_train_step(graphdef, tx, donate=False)


def _torch_model(sd: dict[str, np.ndarray]) -> TorchGPT:
    model = TorchGPT(MC, torch.float32)
    load_state_numpy(model, sd)
    return model


def _batch(seed: int, micro: int = 1):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, MC.vocab_size, size=(micro, B, T + 1)).astype(np.int32)
    return toks[..., :-1], toks[..., 1:]


def _rel(a, b) -> float:
    """Max-norm relative error of `a` against `b`."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _rel_fro(a, b) -> float:
    """Frobenius-norm relative error (parameters after an Adam step: an element whose gradient is at
    the eps scale moves by a rounding-sensitive amount, so the max norm would judge conditioning)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_same_weights_same_loss_and_logits():
    graphdef, params = _jax_model()
    sd = _randomised_state_dict(params)
    params = state_dict.state_dict_to_params(sd, params)
    tmodel = _torch_model(sd)
    x, y = _batch(0)
    x, y = x[0], y[0]

    @jax.jit
    def forward(params_, x_BT, y_BT):
        from frontier_jax.ops import reference as ref

        model = nnx.merge(graphdef, params_)
        h_ND = model.hidden(x_BT).reshape(B * T, MC.model_dim)
        return model(x_BT, y_BT), ref.head_logits(h_ND, model.tok_emb[...], MC.logit_softcap).reshape(B, T, -1)

    jloss, jlogits = (np.asarray(a) for a in forward(params, jnp.asarray(x), jnp.asarray(y)))
    with torch.no_grad():
        tloss = tmodel(torch.from_numpy(x).long(), torch.from_numpy(y).long()).numpy()
        tlogits = tmodel.logits(torch.from_numpy(x).long()).numpy()
    assert jloss.shape == tloss.shape == (B, T)
    assert np.all(np.isfinite(tloss)) and tloss.mean() > 1.0
    assert _rel(tlogits, jlogits) < 1e-5, _rel(tlogits, jlogits)
    assert _rel(tloss, jloss) < 1e-5, _rel(tloss, jloss)
    assert abs(tloss.mean() - jloss.mean()) / jloss.mean() < 1e-5


def _torch_train_step(model, opt, x_MBT, y_MBT, lr_scale, momentum) -> float:
    M = x_MBT.shape[0]
    total = 0.0
    for m in range(M):
        loss = model(torch.from_numpy(x_MBT[m]).long(), torch.from_numpy(y_MBT[m]).long()).mean()
        (loss / M).backward()
        total += float(loss.detach())
    opt.step(lr_scale, momentum)
    opt.zero_grad()
    return total / M


def test_one_optimizer_step_same_parameters(jax_step):
    graphdef, tx, step = jax_step
    _, params = _jax_model()
    sd0 = _randomised_state_dict(params)
    params = state_dict.state_dict_to_params(sd0, params)
    opt_state = tx.init(params)
    tmodel = _torch_model(sd0)
    topt = Optimizers(tmodel, OC)
    groups = {k: len(g.param_groups[0]["params"]) for k, g in (("muon", topt.muon), ("embed", topt.embed),
                                                                  ("scalar", topt.scalar))}
    assert groups == {"muon": 6 * MC.num_layers, "embed": 1, "scalar": 4 * MC.num_layers + 1}

    x, y = _batch(1, micro=2)  # two micro-batches: gradient accumulation on both sides
    mom = schedules.muon_momentum(OC, 0)
    params, opt_state, m = step(params, opt_state, jnp.asarray(x), jnp.asarray(y), jnp.float32(1.0),
                                jnp.float32(mom), None)
    tloss = _torch_train_step(tmodel, topt, x, y, 1.0, mom)
    assert abs(tloss - float(m["loss"])) / float(m["loss"]) < 1e-5

    jsd = state_dict.params_to_state_dict(params)
    tsd = state_dict_numpy(tmodel)
    moved = 0
    for k in sd0:
        assert _rel_fro(tsd[k], jsd[k]) < 1e-5, (k, _rel_fro(tsd[k], jsd[k]))
        assert _rel(tsd[k], jsd[k]) < 1e-4, (k, _rel(tsd[k], jsd[k]))
        moved += int(np.max(np.abs(jsd[k] - sd0[k])) > 1e-4)
    assert moved == len(sd0), "every parameter (Muon and both Adam groups) should have been updated"


def test_twenty_steps_losses_agree(jax_step):
    graphdef, tx, step = jax_step
    _, params = _jax_model(seed=3)
    sd0 = state_dict.params_to_state_dict(params)  # the plain JAX init (zero-init projections), shared
    opt_state = tx.init(params)
    tmodel = _torch_model(sd0)
    topt = Optimizers(tmodel, OC)
    jl, tl = [], []
    for i in range(20):
        x, y = _batch(100 + i % 4, micro=2)  # a few batches repeated, so the loss goes down
        scale = schedules.lr_scale(OptimConfig(warmdown_mode="steps", warmdown_steps=5), i, 0.0, 1.0, 20)
        mom = schedules.muon_momentum(OC, i)
        params, opt_state, m = step(params, opt_state, jnp.asarray(x), jnp.asarray(y), jnp.float32(scale),
                                    jnp.float32(mom), None)
        jl.append(float(m["loss"]))
        tl.append(_torch_train_step(tmodel, topt, x, y, scale, mom))
    diffs = np.abs(np.array(jl) - np.array(tl))
    assert diffs.max() < 1e-3, list(zip(jl, tl))
    assert jl[-1] < jl[0] - 0.1  # it trained


def test_npz_round_trip_between_implementations(tmp_path):
    graphdef, params = _jax_model()
    sd = _randomised_state_dict(params)
    npz.save_npz(tmp_path / "w.npz", sd)
    from baseline_torch.model import load_npz, save_npz

    tmodel = TorchGPT(MC, torch.float32)
    load_npz(tmodel, tmp_path / "w.npz")
    save_npz(tmodel, tmp_path / "back.npz")
    back, _ = npz.load_npz(tmp_path / "back.npz")
    assert set(back) == set(sd)
    assert all(np.array_equal(back[k], sd[k]) for k in sd)
    bad = dict(sd)
    bad.pop("skip_weights")
    with pytest.raises(ValueError, match="skip_weights"):
        load_state_numpy(tmodel, bad, "bad.npz")


@pytest.mark.slow
def test_torch_trainer_writes_the_run_layout(byte_data, tmp_path):
    from baseline_torch.train import main

    out = tmp_path / "run"
    sets = [s for o in TINY_OVERRIDES for s in ("--set", o)]
    rc = main(["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
               "--threads", "1", *sets, "--set", "train.max_steps=3"])
    assert rc == 0
    for name in ("config.json", "env.json", "metrics.jsonl", "summary.json", "summary.txt", "train.log",
                 "curves.png", "weights.npz"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stop_reason"] == "max_steps"
    assert summary["tokens"] == 3 * 512 and 0 < summary["val_bpb"] < 10
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3]
    vals = [r for r in rows if r["kind"] == "val"]
    assert vals[-1]["final"] is True and rows[-1]["kind"] == "roundtrip"  # the int8+zlib round trip comes last
    assert json.loads((out / "env.json").read_text())["compute_dtype"] == "float32"
