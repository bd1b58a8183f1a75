"""The README is a short front page and docs/ holds the rest: every page the README links exists, every
docs page is reachable from the README or the kernels index, every relative link resolves, and the text
states current facts (no progress wording: git keeps the history)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PROGRESS = re.compile(r"issue [0-9]|\bnow\b|\bthen\b|\(was |before these|at [0-9a-f]{7}", re.IGNORECASE)
QUOTE = re.compile(r"\('[^']*'\)")  # a quotation of AWS's documents, as the emulator's rule table writes them


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _links(page: Path) -> set[Path]:
    """The local files a Markdown page links to, resolved against the page's folder."""
    return {(page.parent / m).resolve() for m in LINK.findall(page.read_text()) if "://" not in m}


def test_every_linked_page_exists_and_every_page_is_linked():
    readme_links = _links(README)
    assert any(p.is_relative_to(DOCS) for p in readme_links), "the README links no docs page"
    for page in [README, *_pages()]:
        missing = sorted(str(p.relative_to(REPO)) for p in _links(page) if not p.exists())
        assert not missing, f"{page.relative_to(REPO)} links missing files: {missing}"
    reachable = readme_links | _links(DOCS / "kernels" / "index.md")
    unlinked = [str(p.relative_to(REPO)) for p in _pages() if p.resolve() not in reachable]
    assert not unlinked, f"docs pages linked from neither the README nor docs/kernels/index.md: {unlinked}"


def test_readme_is_a_short_front_page():
    n = len(README.read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines (at most 200: move the detail to docs/)"


def test_no_progress_wording():
    hits = [f"{page.relative_to(REPO)}:{i}: {line.strip()}"
            for page in [README, *_pages()]
            for i, line in enumerate(page.read_text().splitlines(), 1) if PROGRESS.search(QUOTE.sub('', line))]
    assert not hits, "state current facts, not history:\n" + "\n".join(hits)


def test_the_pattern_catches_progress_wording():
    """The check is not vacuous: each kind of progress wording it is meant to refuse matches."""
    for line in ["fixed in issue 15", "it is now faster", "then 3.2 ms", "34 us (was 60)",
                 "700 s before these changes", "measured at 746519c"]:
        assert PROGRESS.search(line), line
    assert not PROGRESS.search("the forward at 34.4 us per sequence, thence knowable")
    assert not PROGRESS.search(QUOTE.sub("", "NKI 0.4.0 ('the namespace now raises a compilation error')"))


def _layout() -> tuple[set[str], set[str], dict[str, set[str]]]:
    """(top-level modules, packages, each room's modules) as the README's layout block names them: an entry line
    starts with two spaces (more: a description goes on); its leading `X.py` / `X/` names are entries, and a room
    line's words up to the first one ending in ":" are the room's modules."""
    block = README.read_text().split("## Layout", 1)[1].split("```")[1].splitlines()
    modules, packages, rooms = set(), set(), {}
    for line in block[block.index("frontier_jax/") + 1:]:
        if not line.startswith("  "):
            break
        if line.startswith("   "):
            continue
        first, *rest = line.split()
        if first.endswith("/") and not first.endswith(":"):
            packages.add(first[:-1])
            rooms[first[:-1]] = set()
            for word in rest:
                rooms[first[:-1]].add(word.rstrip(":"))
                if word.endswith(":"):
                    break
            continue
        for word in [first, *rest]:
            name = word.rstrip(":")
            if name.endswith(".py"):
                modules.add(name[:-3])
            elif name.endswith("/"):
                packages.add(name[:-1])
            else:
                break
            if word.endswith(":"):
                break
    return modules, packages, rooms


def test_the_readme_layout_block_is_the_tree():
    """Every top-level module and package of frontier_jax, and every module of each room, as the tree has them."""
    pkg = REPO / "frontier_jax"
    modules, packages, rooms = _layout()
    assert modules == {p.stem for p in pkg.glob("*.py")} - {"__init__"}
    assert packages == {p.name for p in pkg.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    for room, names in rooms.items():
        assert names == {p.stem for p in (pkg / room).glob("*.py")} - {"__init__", "__main__"}, room
    assert len(rooms) >= 8  # the rooms are listed with their modules, not only named


def test_what_the_documented_commands_write_in_the_checkout_is_ignored_by_git():
    """Following the README (`prepare --out data/sp1024`, the tokenizer beside it) must not mark every later run
    `-dirty`: each relative --out of a command in the README and docs, and the README's input files, is ignored."""
    import subprocess

    pages = [README, *_pages(), REPO / "bench" / "README.md"]
    outs = {m for page in pages for m in re.findall(r"--out[ =]([A-Za-z0-9_./-]+)", page.read_text())
            if not m.startswith("/") and not re.search(r"\b[A-Z]{2,}\b", m)}  # placeholders: DIR, FILE.npz
    files = set(re.findall(r"--(?:input|tokenizer) ([A-Za-z0-9_.-]+\.(?:jsonl|model))\b", README.read_text()))
    assert {"data/sp1024", "prof/"} <= outs and "fineweb_1024_bpe.model" in files
    res = subprocess.run(["git", "check-ignore", "--no-index", *sorted(outs | files)], cwd=REPO,
                         capture_output=True, text=True)
    if res.returncode == 128:
        import pytest

        pytest.skip(f"not a git checkout: {res.stderr.strip()}")
    ignored = set(res.stdout.split())
    assert ignored == outs | files, f"not in .gitignore: {sorted((outs | files) - ignored)}"


SECTION = re.compile(r"\]\(([^)#\s]+)\),? \"([^\"]+)\"")


def test_every_section_a_page_names_beside_its_link_exists():
    """`[page](path), "Section"` or `(README, "Section")`: the page has a heading that starts with the section's
    name (bench/README.md named a README section that had moved to docs/)."""
    missing = []
    for page in [README, *_pages(), REPO / "bench" / "README.md"]:
        text = page.read_text()
        named = SECTION.findall(text) + [(str(README), s) for s in re.findall(r"\(README(?:\.md)?, \"([^\"]+)\"", text)]
        for target, section in named:
            path = (page.parent / target).resolve()
            heads = [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]
            if not any(h.startswith(" ".join(section.split())) for h in heads):  # a name may wrap
                missing.append(f"{page.relative_to(REPO)}: {target}, \"{section}\"")
    assert not missing, missing


def test_every_documented_training_command_names_its_data():
    """A `train` command with a --config runs only with --data (no config file names a data directory; the
    H200 row of docs/results.md once lacked it); usage lines ([--data DIR]) and elided commands (...) aside."""
    pages = [README, *_pages(), REPO / "bench" / "README.md"]
    commands = [c for page in pages for c in re.findall(r"python -m (?:frontier_jax|baseline_torch)\.train [^`|\n]*",
                                                       page.read_text().replace("\\\n", " "))]
    checked = [c for c in commands if "--config" in c and "[--" not in c and "..." not in c]
    assert len(checked) >= 8
    assert all("--data " in c and "--tokenizer " in c for c in checked), [c for c in checked if "--data " not in c]
