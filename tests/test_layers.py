"""The import layers of pyproject.toml's import-linter contracts hold (what `lint-imports` checks): no
cycle inside frontier_jax, kernels_nki imports nothing from frontier_jax, baseline_torch imports no JAX, and
config / errors / data are leaves."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    """`lint-imports` through its Python API, in a fresh process (it configures the process's logging
    and output streams, which must not touch pytest's)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[out.find("Broken contracts"):] or out


def test_the_leaf_contract_forbids_every_other_module():
    """The leaf contract lists the rest of frontier_jax by name (import-linter cannot say "all but"):
    a new module must be added there."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    leaf = next(c for c in contracts if c["name"].startswith("config, errors and data are leaves"))
    pkg = REPO / "frontier_jax"
    modules = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in pkg.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    sources = {m.split(".")[1] for m in leaf["source_modules"]}
    assert {m.split(".")[1] for m in leaf["forbidden_modules"]} == modules - sources
