"""What a run submits (frontier_jax.run.submission): the code files a training process imported and their UTF-8
bytes, the contest's "code bytes" beside the artifact's."""

from __future__ import annotations

from frontier_jax.interop import quantize  # noqa: F401 (an imported source file of the repository)
from frontier_jax.run import submission


def test_code_bytes_count_the_imported_repository_sources_utf8(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"name": "é"}', encoding="utf-8")
    files = submission.code_files((cfg,))
    names = {f.name for f in files}
    assert {"submission.py", "quantize.py", "torch_format.py", "config.json"} <= names
    assert not any(f.name.startswith("test_") for f in files)  # the tests are not the submission's code
    assert all(f.is_relative_to(submission.REPO) for f in files if f.name != "config.json")
    assert submission.code_bytes([cfg]) == len('{"name": "é"}'.encode()) == 14
