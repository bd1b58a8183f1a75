"""The house's plan holds: the import-linter contracts of pyproject.toml are kept (what `lint-imports` checks)
and each one breaks on an import it forbids; frontier_jax's top level holds exactly the modules and rooms named
here, each room's __init__ says what lives there and what it may import, and the entry-point aliases hold
nothing but the hand-over."""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "frontier_jax"
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]

TOP_LEVEL = {"config", "errors", "model", "optim", "steps", "ttt", "parallel", "checkpoint", "evaluate", "train",
             "trainer"}
ROOMS = {"data", "ngram", "policies", "contest", "run", "ops", "neuron", "interop", "compare", "submission"}
# `python -m frontier_jax.<name>` of a command line that moved into the neuron room
ENTRY_ALIASES = {"neuron_check": "neuron.check", "kernel_report": "neuron.kernel_report", "profile": "neuron.profile"}
# old paths the kernel test files (tests/test_kernels_*.py, owned by the kernel work) still import


def test_import_linter_contracts_are_kept():
    """`lint-imports` through its Python API, in a fresh process (it configures the process's logging
    and output streams, which must not touch pytest's)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[out.find("Broken contracts"):] or out


@pytest.fixture(scope="module")
def graph():
    import grimp
    from importlinter import configuration

    configuration.configure()  # import-linter's settings (its timer), which its contracts read
    return grimp.build_graph(*CONTRACTS["root_packages"], include_external_packages=True, cache_dir=None)


def _contract(options: dict):
    from importlinter.application.use_cases import _register_built_in_contract_types
    from importlinter.domain.contract import registry

    _register_built_in_contract_types()
    session = {k: v for k, v in CONTRACTS.items() if k != "contracts"}
    return registry.get_contract_class(options["type"])(
        name=options["name"], session_options=session,
        contract_options={k: v for k, v in options.items() if k != "name"})


def _violation(graph, options: dict) -> tuple[str, str]:
    """An import the contract forbids: a source module importing a forbidden one, or (acyclic) the reverse of an
    import between two siblings under the first ancestor."""
    if options["type"] == "forbidden":
        return options["source_modules"][0], options["forbidden_modules"][0]
    ancestor = options["ancestors"][0]
    children = sorted(graph.find_children(ancestor))
    for a in children:
        for b in children:
            if a != b and graph.direct_import_exists(importer=a, imported=b, as_packages=True):
                return b, a
    raise AssertionError(f"no import between the children of {ancestor}")


@pytest.mark.parametrize("options", CONTRACTS["contracts"], ids=[c["name"][:60] for c in CONTRACTS["contracts"]])
def test_each_contract_breaks_when_violated(graph, options):
    """Kept on the code as it is; broken once the graph gets one import the contract forbids (a cycle, for the
    acyclic ones): no contract is vacuous."""
    contract = _contract(options)
    assert contract.check(copy.deepcopy(graph), verbose=False).kept
    importer, imported = _violation(graph, options)
    broken = copy.deepcopy(graph)
    broken.add_import(importer=importer, imported=imported)
    assert not contract.check(broken, verbose=False).kept, (importer, imported)


def test_the_ground_contract_forbids_every_other_module():
    """The ground contract lists the rest of frontier_jax by name (import-linter cannot say "all but"): a new
    top-level module or room must be added there (an alias reaches its room, which is listed)."""
    ground = next(c for c in CONTRACTS["contracts"] if c["name"].startswith("config, errors and data are the ground"))
    sources = {m.split(".")[1] for m in ground["source_modules"]}
    assert {m.split(".")[1] for m in ground["forbidden_modules"]} == (TOP_LEVEL | ROOMS) - sources


def test_the_top_level_holds_the_named_modules_and_rooms_only():
    modules = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert modules == TOP_LEVEL | set(ENTRY_ALIASES)
    assert packages == ROOMS


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_says_what_lives_there_and_what_it_may_import(room):
    """The docstring's first paragraph names every module of the room and gives the rule for its imports (the ops
    room's __init__ is its op table, whose docstring goes on)."""
    doc = (ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text())) or "").split("\n\n")[0]
    assert "import" in doc, room
    modules = {p.stem for p in (PKG / room).glob("*.py")} - {"__init__", "__main__"}
    assert all(f"`{m}`" in doc for m in modules), (room, [m for m in modules if f"`{m}`" not in doc])


def _alias_body(path: Path) -> list[ast.stmt]:
    body = ast.parse(path.read_text()).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # the docstring
    return body[1:]


@pytest.mark.parametrize("name, target", sorted(ENTRY_ALIASES.items()))
def test_an_entry_point_alias_only_hands_over_to_its_room(name, target):
    """`import sys`, `from frontier_jax.<target> import main`, `if __name__ == "__main__": sys.exit(main())`."""
    body = _alias_body(PKG / f"{name}.py")
    assert [type(s) for s in body] == [ast.Import, ast.ImportFrom, ast.If]
    assert body[1].module == f"frontier_jax.{target}" and [a.name for a in body[1].names] == ["main"]
    assert ast.unparse(body[2]) == "if __name__ == '__main__':\n    sys.exit(main())"
