"""Every command line's --help: it prints, its description is whole sentences, and every option (every
subcommand's too) says what it does."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from helpers import REPO

# module of each `python -m` command line -> the function its alias or __main__ calls with argv
ENTRY_POINTS = {
    "frontier_jax.train": "main", "frontier_jax.evaluate": "main", "frontier_jax.data.prepare": "main",
    "frontier_jax.compare.arms": "main", "frontier_jax.interop.state_dict": "main", "frontier_jax.ngram.analyze": "main",
    "frontier_jax.neuron.check": "main", "frontier_jax.neuron.kernel_report": "main", "frontier_jax.neuron.profile": "main",
    "baseline_torch.train": "main", "kernels_nki.emulator.rules": "main", "frontier_jax.submission.__main__": "main",
}


def test_every_command_line_is_listed():
    """Every module of the packages that builds an ArgumentParser (argparse's, or errors.ArgumentParser) is one of
    ENTRY_POINTS."""
    built = re.compile(r"=\s*(?:argparse\.)?ArgumentParser\(")  # a parser made (not the class errors.py defines)
    found = {".".join(p.relative_to(REPO).with_suffix("").parts)
             for pkg in ("frontier_jax", "baseline_torch", "kernels_nki") for p in (REPO / pkg).rglob("*.py")
             if built.search(p.read_text())}
    assert found == set(ENTRY_POINTS)


def _parsers(module: str, argv: list[str], monkeypatch) -> list[argparse.ArgumentParser]:
    """The parsers `module`'s main builds on its way to printing --help (subcommands' included)."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args

    def spy(self, args=None, namespace=None):
        seen.append(self)
        return original(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    main = getattr(importlib.import_module(module), ENTRY_POINTS[module])
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return seen


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_help_describes_every_option(module, monkeypatch, capsys):
    parsers = _parsers(module, ["--help"], monkeypatch)
    subs = [a for p in parsers for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in subs:
        for name in sub.choices:
            parsers += _parsers(module, [name, "--help"], monkeypatch)
    text = capsys.readouterr().out
    assert text.startswith("usage: ")
    for p in parsers:
        desc = (p.description or "").strip()
        assert desc and desc[-1] in ".:)?" and desc.count("`") % 2 == 0, (p.prog, desc)  # whole sentences
        bare = [a.option_strings or [a.dest] for a in p._actions
                if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not (a.help or "").strip()]
        assert not bare, f"{p.prog}: options without a help text: {bare}"
