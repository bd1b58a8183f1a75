"""The exit-code table's command-line side (frontier_jax.errors): every entry point's parser answers a bad option
(missing, unknown, out of range) in one line and exit 2, and its numeric options are range-checked."""

from __future__ import annotations

import importlib

import pytest

# (entry point module, argv): each option out of its range (the probe's tracebacks: --devices 0 / -2, --seq-len 0,
# torch --threads -1)
CASES = [
    ("frontier_jax.neuron.check", ["--devices", "0"], "argument --devices: 0 is outside [1, inf]"),
    ("frontier_jax.neuron.check", ["--devices", "-2"], "argument --devices: -2 is outside [1, inf]"),
    ("frontier_jax.ngram.analyze", ["--tables", "x", "--seq-len", "0"], "argument --seq-len: 0 is outside"),
    ("frontier_jax.ngram.analyze", ["--tables", "x", "--max-tokens", "-1"], "argument --max-tokens"),
    ("baseline_torch.train", ["--threads", "-1"], "argument --threads: -1 is outside [1, inf]"),
    ("frontier_jax.evaluate", ["--run", "x", "--stride", "0"], "argument --stride"),
    ("frontier_jax.evaluate", ["--run", "x", "--step", "-3"], "argument --step"),
    ("frontier_jax.data.prepare", ["--input", "a", "--out", "b", "--bytes", "--shard-tokens", "0"], "--shard-tokens"),
    ("frontier_jax.data.prepare", ["--input", "a", "--out", "b", "--train-tokenizer", "7"], "--train-tokenizer"),
    ("frontier_jax.train", ["--num-processes", "0"], "argument --num-processes"),
    ("frontier_jax.compare.arms", ["--arm", "a=jax", "--budget", "nan", "--out", "o"], "argument --budget: nan is"),
    ("frontier_jax.compare.arms", ["--arm", "a=jax", "--budget", "5", "--seeds", "0", "--out", "o"], "--seeds"),
    ("frontier_jax.interop.state_dict", ["export", "--run", "x"], "the following arguments are required: --out"),
    ("frontier_jax.submission.__main__", ["check"], "the following arguments are required: RUN"),
]


@pytest.mark.parametrize("module, argv, fragment", CASES, ids=[f"{m.rsplit('.', 1)[-1]} {' '.join(a[-2:])}"
                                                             for m, a, _ in CASES])
def test_every_entry_point_refuses_a_bad_option_in_one_line(module, argv, fragment, capsys):
    if module.startswith("baseline_torch"):
        pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and fragment in err and "(see --help)" in err, err


def test_range_types():
    from frontier_jax.errors import ArgumentParser, float_in, int_in

    p = ArgumentParser(prog="p")
    p.add_argument("--n", type=int_in(1, 8))
    p.add_argument("--x", type=float_in(0, 1, lo_open=True))
    a = p.parse_args(["--n", "8", "--x", "1"])
    assert (a.n, a.x) == (8, 1.0)
    for argv in (["--n", "9"], ["--n", "1.5"], ["--x", "0"], ["--x", "inf"], ["--x", "nan"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)
