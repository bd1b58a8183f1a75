"""The NKI Python subset, checked on a kernel file's source before it runs (the `kind="ast"` rows of RULES).

Kernel code is every `@nki.jit` function of the file plus every function of the same file that kernel code
calls by name (the NKI compiler inlines them at specialization); in a kernel-helper file (one without
`@nki.jit`, imported by kernel files: `helper_modules`) every function is kernel code. Module-level code that only runs in
Python (imports, constants computed at import) is not kernel code. A violation raises NkiRuleError with
file:line, the rule id and its AWS source.
"""

from __future__ import annotations

import ast
import sys

from kernels_nki.emulator import rules

NKI_MODULES = ("nki", "nki.language", "nki.isa", "nki.typing")
# Python libraries whose values are not NKI values (besides the standard library)
LIBRARIES = ("numpy", "scipy", "torch", "jax", "ml_dtypes")


def _is_jit(decorator: ast.expr) -> bool:
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(node, ast.Attribute) and node.attr == "jit") or (isinstance(node, ast.Name) and node.id == "jit")


def _fail(rule_id: str, detail: str, filename: str, node: ast.AST):
    rules.violate(rule_id, detail, "trn1", location=f"{filename}:{node.lineno}")


def _foreign(module: str, is_module_object: bool) -> bool:
    """A module object from outside nki, or any name from the standard library or a numeric library; a
    function imported from another kernel-helper file is NKI code the compiler inlines (language guide,
    Composable Kernels), so it is allowed."""
    top = module.split(".")[0]
    if top == "nki":
        return False
    return is_module_object or top in sys.stdlib_module_names or top in LIBRARIES


def _imports(tree: ast.Module, filename: str) -> dict[str, str]:
    """Foreign names bound at module level by imports -> their module; neuronxcc imports are rejected."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _foreign(alias.name, True):
                    names[(alias.asname or alias.name).split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if _foreign(node.module, False):
                    names[alias.asname or alias.name] = node.module
        else:
            continue
        for mod in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]):
            if mod.split(".")[0] == "neuronxcc":
                _fail("ast.neuronxcc_namespace", f"import of {mod}", filename, node)
    return {k: v for k, v in names.items() if v != "__future__"}


def helper_modules(tree: ast.Module) -> list[str]:
    """The project's kernel-helper modules a kernel file imports from (`from kernels_nki.<m> import ...`):
    the emulator's loader runs them against the emulated nki too."""
    return [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
            and n.module.split(".")[0] == "kernels_nki"]


def kernel_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The @nki.jit functions and the module functions they reach by name, transitively (every function,
    in a helper file without @nki.jit)."""
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    todo = [f for f in funcs.values() if any(_is_jit(d) for d in f.decorator_list)] or list(funcs.values())
    seen = {f.name for f in todo}
    out = []
    while todo:
        fn = todo.pop()
        out.append(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in funcs and node.id not in seen:
                seen.add(node.id)
                todo.append(funcs[node.id])
    return sorted(out, key=lambda f: f.lineno)


def check_source(source: str, filename: str) -> ast.Module:
    """Checks the file's kernel code; returns its syntax tree."""
    tree = ast.parse(source, filename)
    imported = _imports(tree, filename)
    foreign = set(imported)
    for fn in kernel_functions(tree):
        if any(_is_jit(d) for d in fn.decorator_list) and (fn.args.kwonlyargs or fn.args.vararg):
            _fail("ast.kwonly_args", f"kernel {fn.name} has keyword-only or *args parameters", filename,
                  fn.decorator_list[0])
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                _fail("ast.is_operator", f"`is` / `is not` in {fn.name}", filename, node)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in foreign:
                _fail("ast.foreign_module", f"{fn.name} uses {node.id} (module {imported[node.id]})", filename, node)
    return tree
