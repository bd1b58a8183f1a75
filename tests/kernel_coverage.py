"""Branch coverage of the kernel source (kernels_nki/, the emulator and the Neuron-only registry loader left out)
while the emulator-backed kernel tests (tests/test_kernels_*.py) run; a full run fails on an uncovered line or
branch, with the report in the summary.

`--kernel-branch-coverage=auto` (the default) measures and gates a full run only: no file or test named, no `-k`,
`-m` or `--deselect` (`python -m pytest`, the README's and `.ci/run`'s command), since a subset leaves the shared
helpers partly unexercised. `on` gates any run, `off` measures nothing. Only the kernel tests are traced (coverage
costs the emulator ~40% of their time; the rest of the suite runs untraced)."""

from __future__ import annotations

import io
import pathlib

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kernels_nki"
NOT_KERNEL_CODE = [str(KERNELS / "emulator" / "*"), str(KERNELS / "registry.py")]


def pytest_addoption(parser):
    parser.addoption("--kernel-branch-coverage", choices=("auto", "on", "off"), default="auto",
                     help="branch coverage of kernels_nki/ under tests/test_kernels_*.py, failing on an uncovered "
                          "branch: auto = full runs only (default), on = always, off = never")


def full_run(config) -> bool:
    """Whether the session runs the whole suite: pytest's testpaths, no selection by keyword, marker or deselect."""
    o = config.option
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not o.keyword and not o.markexpr
            and not o.deselect)


def pytest_configure(config):
    mode = config.getoption("--kernel-branch-coverage")
    if mode == "on" or (mode == "auto" and full_run(config)):
        config.pluginmanager.register(KernelCoverage(), "kernel_branch_coverage")


class KernelCoverage:
    def __init__(self):
        import coverage  # a test dependency (pyproject's `test` extra)

        self.cov = coverage.Coverage(branch=True, data_file=None, source=[str(KERNELS)], omit=NOT_KERNEL_CODE)
        self.report = ""

    def pytest_sessionstart(self, session):
        """Every kernel file loaded under the emulator once, traced: a module body (imports, definitions) runs once
        per reading, and a test outside tests/test_kernels_*.py may load a module first."""
        from kernels_nki import emulator

        self.cov.start()
        try:
            for path in sorted(KERNELS.rglob("*.py")):
                rel = path.relative_to(KERNELS.parent).with_suffix("")
                if rel.parts[1] == "emulator" or rel.name == "registry":
                    continue
                emulator.load_kernel_module(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
        finally:
            self.cov.stop()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        traced = item.path.name.startswith("test_kernels_")
        if traced:
            self.cov.start()
        try:
            yield
        finally:
            if traced:
                self.cov.stop()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        out = io.StringIO()
        covered = self.cov.report(file=out, show_missing=True, skip_covered=True)
        self.report = out.getvalue()
        if covered < 100.0:
            self.report += f"kernel branch coverage {covered:.2f}% < 100%: each line or branch above needs a test " \
                           "under tests/test_kernels_*.py or is dead code\n"
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_sep("-", "kernel branch coverage (kernels_nki/, tests/test_kernels_*.py)")
        terminalreporter.write(self.report)
