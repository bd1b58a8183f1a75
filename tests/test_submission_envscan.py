"""The AST scan finds environment access in any spelling, and none in the project's own code."""

import pytest

from frontier_jax.contest.codebytes import PROJECT_PACKAGES
from frontier_jax.submission import envscan
from helpers import REPO

FOUND = [
    "import os\nn = os.environ['NUM_LAYERS']",
    "import os\nn = os.environ.get('NUM_LAYERS', '9')",
    "import os\nn = os.getenv('NUM_LAYERS')",
    "from os import environ\nn = 1",
    "from os import getenv as g\nn = g('X')",
    "import os as o\nn = o.environ.copy()",
    "import os\nn = getattr(os, 'environ')['X']",
    "import os\nn = vars(os)['getenv']('X')",
    "import importlib\nn = importlib.import_module('os').getenv('X')",
    "import posix\nn = posix.environ[b'X']",
    "import os\nos.environ['XLA_FLAGS'] = '--x'",  # a write: a library the code calls reads it
    "def f(env=__import__('os').environb):\n    return env",
]
NOT_FOUND = [
    '"""Reads no environment variable: os.environ is never used."""\nx = 1',
    "# os.getenv('X') in a comment\nx = 1",
    "msg = 'set the environ variable'\nenviron_like = 1",
    "x = {'environ': 1}",  # a dict key, not an access
]


@pytest.mark.parametrize("src", FOUND)
def test_every_spelling_is_found(src):
    found = envscan.scan_source(src, "cfg.py")
    assert found and found[0].path == "cfg.py" and found[0].line >= 1 and found[0].code


@pytest.mark.parametrize("src", NOT_FOUND)
def test_words_are_not_uses(src):
    assert envscan.scan_source(src, "cfg.py") == []


def test_the_project_reads_no_environment_variable():
    paths = [p for pkg in PROJECT_PACKAGES for p in (REPO / pkg).rglob("*.py")]
    findings, unreadable = envscan.scan_files(paths)
    assert len(paths) > 100 and findings == [] and unreadable == []


def test_an_unparsable_file_is_reported(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    findings, unreadable = envscan.scan_files([bad])
    assert findings == [] and len(unreadable) == 1 and str(bad) in unreadable[0]
