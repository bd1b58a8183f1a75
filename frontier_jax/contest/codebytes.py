"""The code a run counts: the project's source files it imported, never an environment's packages.

parameter-golf counts `len(code.encode("utf-8"))` of its one `train_gpt.py` (`code = Path(__file__).read_text(
encoding="utf-8")`), the file all counted code lives in. Here the code is packages, so a run's code is every
module of the project's packages (`PROJECT_PACKAGES`, pyproject.toml's `[tool.setuptools.packages.find]`)
that the process imported (`sys.modules`, by the module's own name: `python -m frontier_jax.train`'s
`__main__` is `frontier_jax.train`), plus the config files `frontier_jax.config.load_config` imported, plus
`extra` files (the run's config.json), each counted as that script is: its text read as UTF-8, encoded again.

Membership is by module name, never by location: a virtual environment inside the repository (the README's
quick start), a site-packages install of the project, or a checkout elsewhere count the same files, and no
third-party module ever counts. The run directory records the files (`code.json`: path, module, bytes,
sha256 of each), so the submission check scans exactly the code that ran and sees whether it changed since.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from frontier_jax.config import CONFIG_MODULE_PREFIX
from frontier_jax.errors import BadInput

PROJECT_PACKAGES = ("frontier_jax", "kernels_nki", "configs", "baseline_torch")
RECORD = "code.json"
COUNTED_AS = ("UTF-8 bytes of the project's source files the run imported (modules of "
              f"{', '.join(PROJECT_PACKAGES)}, and the config files it loaded) plus its config.json; "
              "site-packages never count")


class CodeRecordError(BadInput):
    """An unreadable code.json (one line naming the file)."""


def _module_name(key: str, module) -> str:
    spec = getattr(module, "__spec__", None)
    return getattr(spec, "name", None) or key


def is_project_module(name: str) -> bool:
    return name.split(".")[0] in PROJECT_PACKAGES or name.startswith(CONFIG_MODULE_PREFIX)


def imported_files(extra: tuple = ()) -> dict[Path, str | None]:
    """{source file: module name} of the project's modules this process imported, plus `extra` files
    (module None), in path order."""
    files: dict[Path, str | None] = {}
    for key, module in list(sys.modules.items()):
        name = _module_name(key, module)
        f = getattr(module, "__file__", None)
        if not is_project_module(name) or not f or not f.endswith(".py") or not os.path.isabs(f):
            continue
        p = Path(f).resolve()
        if p.is_file():
            files.setdefault(p, name)
    for e in extra:
        if e and Path(e).is_file():
            files.setdefault(Path(e).resolve(), None)
    return dict(sorted(files.items()))


def file_bytes(path) -> int:
    """The bytes the contest counts for one file: `len(text.encode("utf-8"))` of the file read as UTF-8."""
    return len(Path(path).read_text(encoding="utf-8").encode("utf-8"))


def count_bytes(files) -> int:
    return sum(file_bytes(f) for f in files)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class CodeFile:
    path: str
    module: str | None
    bytes: int
    sha256: str


def record(files: dict[Path, str | None]) -> dict:
    """code.json's object: every file with its module, counted bytes and sha256, and the total."""
    rows = [CodeFile(str(p), m, file_bytes(p), sha256(p)) for p, m in files.items()]
    return {"counted_as": COUNTED_AS, "code_bytes": sum(r.bytes for r in rows), "files": [r.__dict__ for r in rows]}


def write_record(run_dir, files: dict[Path, str | None]) -> dict:
    """Write `<run_dir>/code.json` (temporary name, then rename); returns its object."""
    obj = record(files)
    path = Path(run_dir) / RECORD
    tmp = path.with_name(f".{RECORD}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return obj


def read_record(run_dir) -> list[CodeFile] | None:
    """The files of `<run_dir>/code.json` (None when the run has none); CodeRecordError when unreadable."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        return [CodeFile(str(f["path"]), f.get("module"), int(f["bytes"]), str(f["sha256"])) for f in obj["files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise CodeRecordError(f"{path}: unreadable code record ({type(e).__name__}: {e})") from None


def current_path(f: CodeFile) -> Path | None:
    """Where a recorded file is on this machine: its recorded path, else its module's file here (a run
    checked on another checkout), else None."""
    p = Path(f.path)
    if p.is_file():
        return p
    if f.module and is_project_module(f.module) and not f.module.startswith(CONFIG_MODULE_PREFIX):
        try:
            spec = importlib.util.find_spec(f.module)
        except (ImportError, ValueError):
            return None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            return Path(spec.origin)
    return None


def changed(files: list[CodeFile]) -> list[str]:
    """The recorded files that are missing here or differ from what the run imported (by sha256)."""
    out = []
    for f in files:
        p = current_path(f)
        if p is None:
            out.append(f"{f.path} (missing)")
        elif sha256(p) != f.sha256:
            out.append(f"{p} (changed)")
    return out


def record_run(run_dir, config_file, write: bool = True) -> dict[Path, str | None]:
    """A finished run's code: the project files this process imported and the run's `config_file`
    (config.json), recorded in `<run_dir>/code.json` when `write` (the main process)."""
    files = imported_files((config_file,))
    if write:
        write_record(run_dir, files)
    return files
