"""Helpers the tests share (conftest.py keeps the fixtures and the session's set-up): the repository's paths,
the tiny configs, the kernel tolerances and their check, a synthetic byte-level dataset, and one fake trainer
for the driver's tests."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from frontier_jax.run.interface import RunState, Trainer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SP_MODEL_NAME = "fineweb_1024_bpe.model"
DEV_JSONL_NAME = "fineweb_dev.jsonl"

# configs/tiny.py shrunk further so a run takes seconds on two CPU cores (fp32: no bf16 surprises on CPU).
TINY_OVERRIDES = [
    "model.vocab_size=260",
    "model.num_layers=2",
    "model.model_dim=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.compute_dtype='float32'",
    "train.seq_len=64",
    "train.tokens_per_step=512",
    "train.micro_batch_seqs=4",
    "train.compile_warmup_steps=1",
    "train.val_batch_seqs=4",
    "train.val_every_steps=0",
    "train.val_max_tokens=0",
    "train.max_steps=6",
    "train.budget_seconds=1000.0",
    "optim.warmdown_steps=4",
    "optim.muon_momentum_warmup_steps=4",
    "parallel.num_devices=1",
    "train.measure_peak=False",  # no start-up matmul probe (seconds per run); tests of MFU turn it back on
]

def exit_code(main, argv) -> int:
    """An entry point's exit status: what `main(argv)` returns, or the code of the SystemExit it raises (bad input
    exits 2 through `exit_on_error`)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# Kernel-vs-reference tolerances, max mode: |a - b| <= tol + tol * max|b| (docs/testing.md).
KERNEL_TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def assert_close_max(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.size == 0 and b.size == 0:  # an output empty by construction (qk_attention's XSA side output, XSA off)
        assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
        return
    assert not np.isnan(a).any()
    err, bound = np.abs(a - b).max(), tol + tol * np.abs(b).max()
    assert err <= bound, f"max |a-b| = {err:.3g} > {bound:.3g}"


# Kernels written as source for the emulator's tests (tests/test_emulator_*.py), loaded as modules by name.
_kernel_modules = [0]


def write_kernel(tmp_path, monkeypatch, body: str, header: str = "", sig: str = "a", mark_jit: bool = False):
    """Write a kernel module (`header` lines, then `@nki.jit def k(<sig>):` with `body`) importable by name.

    Returns (module name, "path:line" of the line marked `# <-`, or of the @nki.jit line when mark_jit)."""
    _kernel_modules[0] += 1
    name = f"emu_case_{_kernel_modules[0]}"
    src = f"import nki\nimport nki.language as nl\nimport nki.isa as nisa\n{header}\n\n"
    src += f"@nki.jit{'  # <-' if mark_jit else ''}\ndef k({sig}):\n"
    src += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = next((i + 1 for i, text in enumerate(src.splitlines()) if "# <-" in text), None)
    return name, f"{path}:{line}"


def load_kernel(tmp_path, monkeypatch, body: str, reading: str = "any", **kw):
    """Write and load (AST pass, then execution against the emulated nki, under `reading`) a kernel module ->
    (its kernel k, the marked line)."""
    from kernels_nki import emulator

    name, where = write_kernel(tmp_path, monkeypatch, body, **kw)
    return emulator.load_kernel_module(name, reading=reading).k, where


def run_kernel(tmp_path, monkeypatch, body, *args, target="trn1", **kw):
    """Write, load and run a kernel module on `args`: its first output."""
    from kernels_nki import emulator

    k, _ = load_kernel(tmp_path, monkeypatch, body, **kw)
    return emulator.run(k, *args, target=target)[0]


_WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or "
          "had not but first one their its new after who they have two she been other when there all during "
          "into school time may years more most only over city some world would where later up such used many").split()


def synthetic_documents(n_docs: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(20, 80))
        probs = np.linspace(2.0, 0.2, len(_WORDS))
        words = rng.choice(_WORDS, size=n, p=probs / probs.sum())
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def write_byte_dataset(out: Path, train_tokens: int = 60_000, val_tokens: int = 6_000, seed: int = 0) -> Path:
    """Shards of random English-word documents, byte-tokenized (BOS=1 before each), 2 train shards + 1 val."""
    from frontier_jax.data.shards import write_shard
    from frontier_jax.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    out.mkdir(parents=True, exist_ok=True)

    def stream(n_tokens: int, seed_: int) -> np.ndarray:
        ids: list[int] = []
        for doc in synthetic_documents(10_000, seed_):
            ids += [tok.bos_id, *tok.encode(doc)]
            if len(ids) >= n_tokens:
                break
        return np.asarray(ids[:n_tokens], np.uint16)

    train = stream(train_tokens, seed)
    half = train_tokens // 2
    write_shard(out / "synth_train_000000.bin", train[:half])
    write_shard(out / "synth_train_000001.bin", train[half:])
    write_shard(out / "synth_val_000000.bin", stream(val_tokens, seed + 1))
    return out


def tiny_config(data_dir, *extra: str, tokenizer: str = "bytes"):
    """configs/tiny.py with TINY_OVERRIDES, the data directory and `extra` overrides applied."""
    from frontier_jax.config import apply_overrides, load_config

    sets = [*TINY_OVERRIDES, f"data.data_dir={str(data_dir)!r}", f"data.tokenizer={str(tokenizer)!r}", *extra]
    return apply_overrides(load_config(REPO / "configs" / "tiny.py"), sets)


# ----------------------------------------------------------------------------- a fake trainer for the driver


class FakeClock:
    """The driver's clock (`frontier_jax.run.driver.time`, replaced by a test), advanced by the fake trainer."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class FakeSignals:
    def __init__(self):
        self.received = None
        self.stopping = "stopping before training starts; nothing to save"


class FakeTrainer(Trainer):
    """A trainer with the required methods only, unless asked for more: `checkpoints` (save, discard) and
    `resume` (the RunState it resumes at); the other capabilities keep the interface's defaults. Each step costs
    `step_s` fake seconds of `clock`, each evaluation `eval_s`, each save `save_s`; loss = 1 / (1 + step) unless
    the step is in `nan_at`; a signal arrives after `signal_at` train step calls (warm-up included)."""

    def __init__(self, clock=None, step_s=1.0, eval_s=10.0, save_s=5.0, nan_at=(), signal_at=None,
                 checkpoints=False, resume=None):
        self.clock, self.step_s, self.eval_s, self.save_s = clock or FakeClock(), step_s, eval_s, save_s
        self.nan_at, self.signal_at = set(nan_at), signal_at
        self.trained, self.calls, self.schedule, self.qat = 0, 0, [], []
        self.events, self.rows, self.saves, self.evals = [], [], [], []
        self.signals, self.summaries, self.discarded, self.plugins = FakeSignals(), [], [], []
        if checkpoints:
            self.checkpoints, self.save, self.discard = True, self._save, self.discarded.append
        if resume is not None:
            self.resume = lambda: self._resume(resume)

    def train_step(self, lr, mom, qat=False):
        self.clock.now += self.step_s
        self.qat.append(qat)
        self.trained += 1
        self.calls += 1
        self.schedule.append((lr, mom))
        if self.signal_at is not None and self.calls == self.signal_at:
            self.signals.received = "SIGTERM"
        return self.trained

    def read_metrics(self, handle):
        loss = math.nan if handle in self.nan_at else 1.0 / (1 + handle)
        return loss, 1.0

    def eval_sums(self, max_tokens, **geometry):
        self.clock.now += self.eval_s
        self.evals.append((max_tokens, geometry) if geometry else max_tokens)
        return {"nll_sum_nats": 7.0, "tokens": 10, "bytes": 20}

    def snapshot(self):
        self.events.append("snapshot")
        return self.trained

    def restore(self, token):
        self.events.append(f"restore after {self.trained - token} warm-up steps")
        self.trained = token

    def log(self, msg):
        pass

    def metrics(self, **row):
        self.rows.append(row)

    def write_summary(self, summary):
        self.summaries.append(summary)

    def _resume(self, at: RunState) -> RunState:
        self.trained = at.step
        return RunState(step=at.step, tokens=at.tokens, train_seconds=at.train_seconds, late_qat_step=at.late_qat_step)

    def _save(self, state, reason):
        self.clock.now += self.save_s
        self.saves.append((state.step, reason))

    def add_hook(self, hook):
        self.plugins.append(hook)
        self.run_hooks = lambda: self.plugins

    def hooks(self, **kw):
        """This trainer with some of its methods replaced (log, agree, roundtrip, ...)."""
        for name, fn in kw.items():
            setattr(self, name, fn)
        return self
