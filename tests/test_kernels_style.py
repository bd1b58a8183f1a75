"""Kernel-code style rules of kernels_nki/ checked on the source (the emulator is not kernel code): kernel
state is read by name (unpacking, attributes, string keys), never by an integer position such as `g[1]`."""

import ast
import pathlib

import kernels_nki

ROOT = pathlib.Path(kernels_nki.__file__).parent

def index_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every read `x[k]` with an integer literal k (negative included); a tensor's
    `.shape[k]` is its dimension, not kernel state, and slices (`t[0:rows]`) are tensor views."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)):
            continue
        key = node.slice.operand if isinstance(node.slice, ast.UnaryOp) and isinstance(node.slice.op, ast.USub) \
            else node.slice
        if not (isinstance(key, ast.Constant) and type(key.value) is int):
            continue
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            continue
        out.append((node.lineno, ast.unparse(node)))
    return out


def kernel_files() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "emulator" not in p.relative_to(ROOT).parts)


def test_index_reads_finds_positional_state_and_skips_shapes_and_slices():
    src = "def f(g, t, c):\n    a = g[1] + g[-1] + t.shape[0]\n    b = t[0:2] + t[:, 3:4] + c['dims'] + t[i]\n"
    assert [e for _, e in index_reads(src)] == ["g[1]", "g[-1]"]


def test_kernel_state_is_read_by_name():
    found = {}
    for path in kernel_files():
        reads = index_reads(path.read_text())
        if reads:
            found[str(path.relative_to(ROOT))] = reads
    assert not found, f"integer-index reads of kernel state (name them: unpack, a class or string keys): {found}"
