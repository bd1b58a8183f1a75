"""A run's code bytes count the project's modules it imported (and its config), never an environment's packages:
the same with and without a virtual environment inside the repository."""

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from frontier_jax.config import CONFIG_MODULE_PREFIX, load_config
from frontier_jax.contest import codebytes
from helpers import REPO

# What a run's code record is, in a fresh interpreter: the trainer's modules imported as a run imports them,
# its config loaded by load_config, then the files counted with the run's config.json.
PROBE = """
import json, sys
sys.path.insert(0, {repo!r})
{extra}
import frontier_jax.trainer
from frontier_jax.config import load_config
from frontier_jax.contest import codebytes
load_config({repo!r} + "/configs/tiny.py")
assert frontier_jax.trainer.__file__.startswith({repo!r}), frontier_jax.trainer.__file__
files = codebytes.imported_files(({repo!r} + "/config.json",))
print(json.dumps({{"bytes": codebytes.count_bytes(files), "files": sorted(str(p) for p in files),
                  "modules": sorted(k for k in sys.modules if k.split(".")[0] == "venvdep")}}))
"""


def _probe(python: str, repo: Path, extra: str = "") -> dict:
    out = subprocess.run([python, "-I", "-c", PROBE.format(repo=str(repo), extra=extra)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_code_bytes_are_the_same_with_and_without_a_venv_inside_the_repository(tmp_path):
    """A copy of the project's packages as a repository; once with a virtual environment inside it (the README's
    quick start: `python3 -m venv .venv` in the checkout) whose site-packages holds a package the run imports,
    once without. The counted files and bytes are equal, and nothing under .venv counts."""
    repo = tmp_path / "repo"
    for pkg in codebytes.PROJECT_PACKAGES:
        shutil.copytree(REPO / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "config.json").write_text('{"name": "tiny"}\n', encoding="utf-8")
    without = _probe(sys.executable, repo, "sys.path.append(" + repr(sysconfig.get_paths()["purelib"]) + ")")

    venv.EnvBuilder(with_pip=False, symlinks=True).create(repo / ".venv")
    site = Path(next((repo / ".venv" / "lib").glob("python*/site-packages")))
    (site / "venvdep").mkdir()
    (site / "venvdep" / "__init__.py").write_text("from venvdep import part\nVALUE = part.VALUE\n")
    (site / "venvdep" / "part.py").write_text('VALUE = "a package installed in the venv of the repository"\n' * 50)
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # jax, numpy, ... from this env
    inside = _probe(str(repo / ".venv" / "bin" / "python"), repo, "import venvdep")

    assert inside["modules"] == ["venvdep", "venvdep.part"]  # the venv's package was imported ...
    assert not [f for f in inside["files"] if "/.venv/" in f]  # ... and not counted
    assert inside["files"] == without["files"] and inside["bytes"] == without["bytes"]
    assert len(without["files"]) > 20 and str(repo / "configs" / "tiny.py") in without["files"]


def test_imported_files_are_project_modules_and_loaded_configs(tmp_path):
    import numpy

    cfg_json = tmp_path / "config.json"
    cfg_json.write_text('{"name": "é"}', encoding="utf-8")
    load_config(REPO / "configs" / "tiny.py")
    files = codebytes.imported_files((cfg_json,))
    assert files[cfg_json.resolve()] is None
    assert files[(REPO / "configs" / "tiny.py").resolve()] == f"{CONFIG_MODULE_PREFIX}tiny"
    assert files[(REPO / "frontier_jax" / "config.py").resolve()] == "frontier_jax.config"
    assert Path(numpy.__file__).resolve() not in files
    assert not [p for p in files if p.is_relative_to(REPO / "tests")]  # this test module is not the project's
    assert codebytes.file_bytes(cfg_json) == len('{"name": "é"}'.encode()) == 14  # UTF-8, as train_gpt.py counts


def test_the_record_names_each_file_and_sees_a_change(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("X = 1\n")
    obj = codebytes.write_record(tmp_path, {mod: "m"})
    assert obj["code_bytes"] == 6 and json.loads((tmp_path / codebytes.RECORD).read_text()) == obj
    files = codebytes.read_record(tmp_path)
    assert [(f.module, f.bytes) for f in files] == [("m", 6)] and codebytes.changed(files) == []
    mod.write_text("X = 2\n")
    assert codebytes.changed(files) == [f"{mod} (changed)"]
    mod.unlink()
    assert codebytes.changed(files) == [f"{mod} (missing)"]
    (tmp_path / codebytes.RECORD).write_text("{not json")
    with pytest.raises(codebytes.CodeRecordError) as e:
        codebytes.read_record(tmp_path)
    assert str(tmp_path / codebytes.RECORD) in str(e.value) and "\n" not in str(e.value)
    assert codebytes.read_record(tmp_path / "absent") is None


def test_a_recorded_module_is_found_in_another_checkout(tmp_path):
    """A run checked elsewhere: the recorded path is gone, the module's file here is compared by sha256."""
    here = REPO / "frontier_jax" / "contest" / "rules.py"
    f = codebytes.CodeFile("/elsewhere/frontier_jax/contest/rules.py", "frontier_jax.contest.rules",
                           codebytes.file_bytes(here), codebytes.sha256(here))
    assert codebytes.current_path(f) == here.resolve() or codebytes.current_path(f) == here
    assert codebytes.changed([f]) == []
