"""Environment-variable reads in source files, found by an AST scan (as the Trainium contest's reviewer flagged them).

A finding is any use of the process environment, however it is spelled: an attribute or a name `environ`,
`environb`, `getenv`, `getenvb`, `putenv` or `unsetenv` (`os.environ[...]`, `os.environ.get(...)`,
`os.getenv(...)`, `from os import environ` then `environ.get(...)`, `posix.environ`, an import aliased to
another name, `importlib.import_module("os").getenv`), an import of one of them, and one of these names as a
string given to a call or an index (`getattr(os, "environ")`, `vars(os)["getenv"]`). Writes count too: a
variable the code sets is one a library it calls reads. Docstrings, comments and other strings are not uses
and never match. Not found: a name built at run time (`"env" + "iron"`), which no static scan sees.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    code: str  # the source line, stripped

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


def _hits(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
            yield node
        elif isinstance(node, ast.Name) and node.id in ENV_NAMES:
            yield node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                a.name.split(".")[-1] in ENV_NAMES for a in node.names):
            yield node
        elif isinstance(node, ast.Call):
            yield from (a for a in [*node.args, *(k.value for k in node.keywords)] if _is_env_string(a))
        elif isinstance(node, ast.Subscript) and _is_env_string(node.slice):
            yield node


def _is_env_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENV_NAMES


def scan_source(text: str, path: str) -> list[Finding]:
    """The findings in one file's source; SyntaxError propagates (the caller reports the file)."""
    lines = text.splitlines()
    found = {}
    for node in _hits(ast.parse(text, filename=path)):
        line = getattr(node, "lineno", 0)
        found.setdefault(line, Finding(path, line, lines[line - 1].strip() if 0 < line <= len(lines) else ""))
    return [found[k] for k in sorted(found)]


def scan_files(paths) -> tuple[list[Finding], list[str]]:
    """(findings, files that could not be parsed: 'path (why)') over Python source files."""
    findings, unreadable = [], []
    for p in paths:
        try:
            findings += scan_source(Path(p).read_text(encoding="utf-8"), str(p))
        except (OSError, UnicodeDecodeError, SyntaxError) as e:
            unreadable.append(f"{p} ({type(e).__name__}: {e})")
    return findings, unreadable
