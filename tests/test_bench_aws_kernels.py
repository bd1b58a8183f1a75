"""bench/aws_kernels.py on a checkout of our own, laid out like aws-neuron/nki-library (no AWS code in the repository):
a kernel file importing a helper package-relatively runs unchanged through the emulator's loader and is reported
match / wrong against a NumPy reference; a kernel breaking a rule is reported refused with the rule id; the
package's `__init__` (install glue) is never executed."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from bench import aws_cases, aws_kernels

INIT_GLUE = "raise RuntimeError('package __init__ executed')\n"

HELPERS = '''
import math
from typing import Optional, Tuple

import nki.isa as nisa
import nki.language as nl

_MAX = {nl.float8_e4m3: 240.0, nl.float8_e4m3fn: 448.0}  # a module-level dict keyed by dtype: Python, not kernel code


def tiles(n: int, size: int) -> int:
    return math.ceil(n / size)


def scaled_copy(dst, src, scale: Optional[float] = None) -> Tuple[int, int]:
    if scale is None:
        scale = 1.0
    nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
    return dst.shape
'''

KERNEL = '''
from dataclasses import dataclass
from typing import Tuple

import nki
import nki.language as nl

from ..utils.helpers import _MAX, scaled_copy, tiles


@dataclass(frozen=True)
class Config(nl.NKIObject):
    scale: float = 2.0


@nki.jit
def demo(x: nl.ndarray, cfg: Config) -> Tuple[nl.ndarray]:
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    assert _MAX[nl.float8_e4m3fn] == 448.0
    for i in nl.affine_range(tiles(x.shape[0], 128)):
        t = nl.load(x[i * 128:(i + 1) * 128])
        r = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
        scaled_copy(r, t, cfg.scale)
        nl.store(out[i * 128:(i + 1) * 128], r)
    return out
'''

BAD = '''
import nki
import nki.language as nl


@nki.jit
def bad(x):
    if x is True:
        x = x
    return x
'''


def _checkout(root):
    tree = root / "src" / "nkilib_src" / "nkilib"
    files = {"__init__.py": INIT_GLUE, "core/__init__.py": INIT_GLUE, "core/utils/__init__.py": INIT_GLUE,
             "core/utils/helpers.py": HELPERS, "core/demo/__init__.py": INIT_GLUE, "core/demo/demo.py": KERNEL,
             "core/demo/bad.py": BAD, "core/demo/demo_torch.py": "import torch\n"}
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(textwrap.dedent(text))
    return root


X = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)


def _case(name, ref):
    x = X
    return aws_cases.Case("nki-library", "core/demo/demo.py", "demo", name, lambda m: ((x, m.Config()), {}),
                          lambda args, kw: ref(args[0]), 1e-6, 1e-6, "ours")


def test_script_reports_match_wrong_and_refused(tmp_path, monkeypatch, capsys):
    checkout = _checkout(tmp_path / "checkout")
    monkeypatch.setattr(aws_cases, "CASES", (_case("doubles", lambda x: 2 * x), _case("thrice", lambda x: 3 * x)))
    assert aws_kernels.main([str(checkout)]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in lines[:-1]}
    status = {name: line.split()[1] for name, line in by_name.items()}
    assert status["nki-library:core/demo/demo.py:doubles"] == "match"
    assert status["nki-library:core/demo/demo.py:thrice"] == "wrong"
    assert f"max |err| {np.abs(X).max():.3g} (max: rtol 1e-06" in by_name["nki-library:core/demo/demo.py:thrice"]
    bad = by_name["nki-library:core/demo/bad.py"]
    assert " refused " in bad and "[ast.is_operator]" in bad and "bad.py:8" in bad
    assert not any("demo_torch" in line for line in lines)
    assert lines[-1] == "total: match 1, refused 1, wrong 1"


def test_not_a_checkout_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="not an nki-library or nki-samples checkout"):
        aws_kernels.main([str(tmp_path)])
