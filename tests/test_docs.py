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
