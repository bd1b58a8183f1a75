"""frontier_jax.neuron.check: every config's programs pass AWS's documented JAX limits; each rule fails on a
program made to break it (and passes its valid twin); strict mode refuses a failing program in one line;
docs/trn1.md's rule table is the module's; the constraints files pin what AWS documents."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from helpers import REPO
from frontier_jax import trainer, ops
from frontier_jax.neuron import check as neuron_check
from frontier_jax.neuron.program import on_neuron
from frontier_jax.config import load_config

CONFIGS = sorted((REPO / "configs").glob("*.py"))


def _rules(fn, *args) -> set[str]:
    return {f.rule for f in neuron_check.check_program("p", jax.make_jaxpr(fn)(*args))}


MODEL_OPS = ("qk_attention", "norm_mlp", "mix_norm_projection", "projection", "head_loss", "embed", "rms_norm")


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "__init__.py"], ids=lambda p: p.stem)
def test_every_config_passes_on_one_chip_with_every_op_on_its_kernel(path: Path, neuron_traced):
    """Every config's programs pass, with no op on its reference path (what `--kernels strict` requires): the train
    step calls every model op's kernel, forward and backward, norm_mlp at the config's slope and qk_attention with
    XSA where the config sets it; with optim.fused the optimizer step calls the Adam and Muon kernels (the record's
    Muon settings in configs/frontier.py's)."""
    from frontier_jax.neuron.program import kernel_sites

    cfg = load_config(path)
    traced = neuron_traced(cfg)  # trace_steps(cfg, 2, *on_neuron(cfg)), shared with the kernel report's docs test
    findings = neuron_check.check_traced(traced)
    assert findings == [], [f.line() for f in findings]
    assert ops.switch_fallbacks(cfg.model) == []
    sites = kernel_sites(traced.programs["train"])
    assert {f"frontier_{op}_{d}" for op in MODEL_OPS for d in ("fwd", "bwd")} <= {s.primitive for s in sites}
    params = lambda op, key: {s.eqn.params[key] for s in sites if s.primitive.startswith(f"frontier_{op}_")}
    assert params("norm_mlp", "negative_slope") == {cfg.model.mlp_negative_slope}
    L = cfg.model.num_layers
    assert params("qk_attention", "xsa_on") == {i >= L - cfg.model.xsa_last_n for i in range(L)}
    optimizer = kernel_sites(traced.programs["optimizer"])
    assert {s.primitive for s in optimizer} == ({"frontier_adam_update", "frontier_muon_update"}
                                                if cfg.optim.fused else set())


def test_the_traced_steps_call_kernels_per_device_at_the_per_device_shape():
    from frontier_jax.neuron.program import kernel_sites, trace_steps

    cfg = load_config(REPO / "configs" / "tiny.py")
    for n in (1, 4):
        traced = trace_steps(cfg, n, *on_neuron(cfg))
        sites = kernel_sites(traced.programs["train"])
        assert sites and all(s.per_device for s in sites)
        rows = {s.eqn.invars[0].aval.shape[0] for s in sites if s.primitive == "frontier_head_loss_fwd"}
        per_device = cfg.train.tokens_per_step // n // traced.accum  # tokens of one micro-batch on one device
        assert rows == {per_device}, (n, rows)
        assert "ttt" not in traced.programs  # no test-time training: no SGD step


def test_the_record_config_runs_every_op_on_its_kernel_and_passes(neuron_traced):
    """configs/record11_tiny.py on Neuron: the recipe's switches run inside the kernels (norm_mlp with the record's
    LeakyReLU slope, qk_attention with XSA on its last layers and without on the others), so the traced program
    calls every op's kernel, no op falls back to its reference (what `--kernels strict` requires) and the program
    check passes; a model whose setting a kernel lacks (a negative slope) gets the fallback named in the report.
    Its test-time training's SGD step is traced and checked too: the same kernels, per device, at a chunk's 16 rows
    of 256 (ttt.batch_seqs=32 is more than a chunk of 4,096 holds), 8 per NeuronCore."""
    from frontier_jax.neuron.program import kernel_sites

    cfg = load_config(REPO / "configs" / "record11_tiny.py")
    traced = neuron_traced(cfg)  # trace_steps(cfg, 2, *on_neuron(cfg)), shared with the check of every config
    sites = kernel_sites(traced.programs["train"])
    called = {s.primitive for s in sites}
    assert {f"frontier_{op}_{d}" for op in ("qk_attention", "norm_mlp", "mix_norm_projection", "projection",
                                             "head_loss", "embed", "rms_norm") for d in ("fwd", "bwd")} <= called
    assert {s.eqn.params["negative_slope"] for s in sites if s.primitive.startswith("frontier_norm_mlp")} == {0.5}
    assert {s.eqn.params["xsa_on"] for s in sites if s.primitive.startswith("frontier_qk_attention")} == {True, False}
    ttt_sites = kernel_sites(traced.programs["ttt"])
    assert {s.primitive for s in ttt_sites} == called and all(s.per_device for s in ttt_sites)
    assert {s.eqn.invars[0].aval.shape[0] for s in ttt_sites if s.primitive == "frontier_head_loss_fwd"} == {8 * 256}
    findings = [f for name, closed in traced.programs.items() for f in neuron_check.check_program(name, closed)]
    assert findings == [] and ops.switch_fallbacks(cfg.model) == []
    report = neuron_check.format_report(cfg.name, 2, findings, [], ttt=True)
    assert "reference fallback" not in report
    assert report.startswith("Neuron program check: record11_tiny on 2 NeuronCore(s): pass (14 rules, train / eval / "
                             "optimizer / TTT steps)")
    leaky = dataclasses.replace(cfg.model, mlp_negative_slope=-0.25)
    report = neuron_check.format_report(cfg.name, 2, findings, ops.switch_fallbacks(leaky))
    assert report.endswith("reference fallback: norm_mlp (model.mlp_negative_slope=-0.25: the kernel reads the "
                           "activation's sign off the stored LeakyReLU(h), which needs a slope >= 0)")


def test_cond_fails_and_a_host_choice_passes():
    x = jnp.ones(4)
    assert _rules(lambda x: jax.lax.cond(x[0] > 0, jnp.sin, jnp.cos, x), x) == {"cond"}
    assert _rules(lambda x: jnp.where(x[0] > 0, jnp.sin(x), jnp.cos(x)), x) == set()


def test_a_kernel_call_outside_shard_map_fails_inside_passes():
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    mesh = AbstractMesh((2,), ("data",))
    with ops.kernel_primitives():
        outside = jax.make_jaxpr(ops.rms_norm)(x)
        inside = jax.make_jaxpr(jax.shard_map(ops.rms_norm, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                                              check_vma=False))(x)
    found = neuron_check.check_program("train", outside)
    assert [f.rule for f in found] == ["kernel.per_device"] and "frontier_rms_norm_fwd" in found[0].line()
    assert neuron_check.check_program("train", inside) == []


def test_a_dynamic_while_fails_a_literal_trip_count_passes():
    x = jnp.float32(1)
    dynamic = lambda x: jax.lax.while_loop(lambda c: c[1] < c[0], lambda c: (c[0], c[1] * 2), (x * 9, x))
    static = lambda x: jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2), (0, x))
    assert _rules(dynamic, x) == {"while.dynamic"}
    assert _rules(static, x) == set()


def test_host_callbacks_fail():
    x = jnp.ones(3)
    assert _rules(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x), x) == {"host_callback"}

    def printed(x):
        jax.debug.print("x {}", x)
        return x + 1

    assert _rules(printed, x) == {"host_callback"}


def test_reduce_precision_and_variadic_reductions_fail():
    x = jnp.ones(8)
    assert _rules(lambda x: jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=2), x) == {"reduce_precision"}
    assert _rules(jnp.argmax, x) == {"reduce.variadic"}
    assert _rules(jnp.max, x) == set()


def test_integer_dots_and_complex_and_fp8_dtypes():
    i = jnp.ones((4, 4), jnp.int32)
    assert _rules(lambda a: a @ a, i) == {"dot.integer"}
    assert _rules(lambda a: a.astype(jnp.float32) @ a.astype(jnp.float32), i) == set()
    assert _rules(lambda a: (a * 1j).real, jnp.ones(3)) == {"dtype.complex"}
    assert _rules(lambda a: a.astype(jnp.float8_e4m3fn).astype(jnp.float32), jnp.ones(3)) == {"dtype.fp8"}
    assert _rules(lambda a: a.astype(jnp.float8_e4m3).astype(jnp.float32), jnp.ones(3)) == set()
    assert _rules(lambda a: a.astype(jnp.float8_e5m2).astype(jnp.float32), jnp.ones(3)) == set()


def test_sort_comparators():
    """JAX's float comparator canonicalises NaN / -0 with EQ / NE compares: outside LE, GE, LT, GT."""
    assert _rules(jnp.sort, jnp.ones(5)) == {"sort.comparator"}
    assert _rules(jnp.sort, jnp.ones(5, jnp.int32)) == set()


def test_threefry_fails_rbg_passes():
    assert _rules(lambda k: jax.random.normal(k, (3,)), jax.random.key(0, impl="threefry2x32")) == {"rng.threefry"}
    assert _rules(lambda k: jax.random.normal(k, (3,)), jax.random.key(0, impl="rbg")) == set()


def test_sparse_and_dot_algorithm_presets_fail():
    from jax.experimental import sparse

    m = sparse.BCOO.fromdense(jnp.eye(3))
    assert _rules(lambda m, v: m @ v, m, jnp.ones(3)) == {"sparse"}
    a = jnp.ones((4, 4))
    preset = jax.lax.DotAlgorithmPreset.BF16_BF16_F32
    assert _rules(lambda a: jax.lax.dot(a, a, precision=preset), a) == {"dot.algorithm"}


def test_strict_mode_refuses_a_failing_program_in_one_line(monkeypatch, byte_data):
    from helpers import tiny_config

    bad = neuron_check.Finding("train", "cond", "shard_map/cond", "cond in the program", "known issues")
    monkeypatch.setattr(trainer.jax, "default_backend", lambda: "neuron")
    seen = []
    monkeypatch.setattr(neuron_check, "check_config", lambda cfg, n, dtypes, tx: seen.append((dtypes, tx)) or [bad])
    strict, auto = (tiny_config(byte_data, f"train.kernels={mode!r}") for mode in ("strict", "auto"))
    dtypes, tx, dp = object(), object(), trainer.make_data_parallel(1)
    with pytest.raises(ops.KernelUnavailableError) as e:
        trainer._neuron_program_check(strict, dp, dtypes, tx, 4)
    assert "\n" not in str(e.value) and "rule cond" in str(e.value) and "shard_map/cond" in str(e.value)
    report = trainer._neuron_program_check(auto, dp, dtypes, tx, 4)  # logged, not refused
    assert report == neuron_check.format_report(auto.name, 1, [bad]) and "FAIL  cond" in report
    assert seen == [(dtypes, tx)] * 2  # the run's own dtypes and optimizer are traced: built once, handed over
    monkeypatch.setattr(trainer.jax, "default_backend", lambda: "cpu")
    assert trainer._neuron_program_check(strict, dp, dtypes, tx, 4) is None and len(seen) == 2


def test_docs_rule_table_is_the_modules():
    """docs/trn1.md carries `python -m frontier_jax.neuron_check --markdown` verbatim."""
    assert neuron_check.rules_markdown() in (REPO / "docs" / "trn1.md").read_text()


def test_constraints_pin_the_documented_jax_within_the_projects_range():
    """Each supported SDK's constraints file pins JAX at AWS's documented maximum (0.10.0), inside
    pyproject's range, and names every Neuron package with one exact version."""
    pyproject = (REPO / "pyproject.toml").read_text()
    lo, hi = re.search(r'"jax>=([\d.]+),<([\d.]+)"', pyproject).groups()
    files = sorted((REPO / "constraints").glob("neuron-*.txt"))
    assert [f.stem for f in files] == ["neuron-2.31", "neuron-2.32"]
    for f in files:
        pins = dict(line.split("==") for line in f.read_text().splitlines() if line and not line.startswith("#"))
        assert set(pins) == {"jax", "jaxlib", "jax-neuronx", "libneuronxla", "neuronx-cc", "nki"}
        assert pins["jax"] == pins["jaxlib"] == "0.10.0"
        v = tuple(int(p) for p in pins["jax"].split("."))
        assert tuple(int(p) for p in lo.split(".")) <= v < tuple(int(p) for p in hi.split("."))
        assert f.stem.split("-")[1] in (REPO / "docs" / "trn1.md").read_text()


def test_the_check_prints_the_estimate_per_neuroncore_and_fails_over_hbm(monkeypatch, capsys):
    """Every config's report carries its step's estimated peak per NeuronCore against the HBM AWS documents;
    a step over it fails the rule memory.hbm (exit 1)."""
    from frontier_jax.neuron import memory, program

    tiny = str(REPO / "configs" / "tiny.py")
    assert neuron_check.main(["--config", tiny]) == 0
    out = capsys.readouterr().out
    assert "  memory: step peak estimated " in out and " per NeuronCore at 16 sequences per micro-batch " \
        "(train.micro_batch_seqs) of 16.0 GiB (a trn1 NeuronCore-v2's HBM, as AWS documents it)" in out
    assert "  ok  memory.hbm" in out
    small = memory.DeviceMemory(1 << 20, "a test's HBM", "NeuronCore")
    monkeypatch.setattr(program._memory, "device_memory", lambda backend: small)
    assert neuron_check.main(["--config", tiny]) == 1
    out = capsys.readouterr().out
    assert "FAIL  memory.hbm" in out and "per NeuronCore at 16 sequences per micro-batch, over its 1.0 MiB of HBM" in out
    assert neuron_check.main(["--config", tiny, "--set", "train.micro_batch_seqs=0"]) == 1  # auto: even 1 is over
    assert "at 1 sequence per micro-batch (auto: the largest that fits)" in capsys.readouterr().out
    assert neuron_check.CONFIGS == REPO / "configs"  # no --config: every configs/*.py (test_every_config... runs them)
