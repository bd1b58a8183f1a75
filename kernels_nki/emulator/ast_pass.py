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
    if top in ("nki", "math"):
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
    return {k: v for k, v in names.items() if v != "__future__"}


def _neuronxcc_names(tree: ast.Module) -> dict[str, str]:
    """Names bound by module-level imports from the neuronxcc namespace -> their module."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0]: a.name for a in node.names if a.name.startswith("neuronxcc")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("neuronxcc"):
            names |= {a.asname or a.name: node.module for a in node.names}
    return names


def helper_modules(tree: ast.Module) -> list[str]:
    """The project's kernel-helper modules a kernel file imports from (`from kernels_nki.<m> import ...`):
    the emulator's loader runs them against the emulated nki too."""
    return [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
            and n.module.split(".")[0] == "kernels_nki"]


def _nki_names(tree: ast.Module) -> set[str]:
    """Names the module binds to nki modules or their members (`import nki.language as nl`, `from nki.isa import
    engine`)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "nki"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "nki":
            names |= {a.asname or a.name for a in node.names}
    return names


def kernel_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The @nki.jit functions and the module functions they reach by name, transitively; in a helper file
    without @nki.jit, the functions that use an nki name and those they reach (a function that never touches
    nki is a Python utility the file's kernel code may not even call, e.g. a logger's environment lookup)."""
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    nki_names = _nki_names(tree)
    todo = [f for f in funcs.values() if any(_is_jit(d) for d in f.decorator_list)] or [
        f for f in funcs.values() if any(isinstance(n, ast.Name) and n.id in nki_names for n in ast.walk(f))]
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


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _annotation_nodes(fn: ast.FunctionDef) -> set[int]:
    """ids of every node inside the function's annotations (parameters, return, annotated assignments):
    an annotation is never evaluated as kernel code (`typing.Tuple[...]` is not a call)."""
    roots = [a.annotation for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs,
                                    fn.args.vararg, fn.args.kwarg) if a is not None and a.annotation is not None]
    roots += [fn.returns] if fn.returns is not None else []
    roots += [n.annotation for n in ast.walk(fn) if isinstance(n, ast.AnnAssign)]
    return {id(n) for r in roots for n in ast.walk(r)}


def _check_signature(fn: ast.FunctionDef, filename: str):
    """A kernel's parameters: no keyword-only separator or *args, no list default (reported at the parameter)."""
    if fn.args.vararg is not None:
        _fail("ast.kwonly_args", f"kernel {fn.name} has a *{fn.args.vararg.arg} parameter", filename, fn.args.vararg)
    if fn.args.kwonlyargs:
        _fail("ast.kwonly_args", f"kernel {fn.name}: parameter {fn.args.kwonlyargs[0].arg} follows the keyword-only "
              "separator `*`", filename, fn.args.kwonlyargs[0])
    params = [*fn.args.posonlyargs, *fn.args.args]
    for param, default in zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults):
        if isinstance(default, (ast.List, ast.ListComp)):
            _fail("kernel.list_args", f"kernel {fn.name}: parameter {param.arg} defaults to a list (use a tuple)",
                  filename, param)


STRICT_SOURCE = "__nki_strict_source__"  # a loaded module's strict findings (`strict_findings`), its helpers' too


def strict_findings(tree: ast.Module, filename: str) -> tuple:
    """(rule id, detail, file:line) of each form in the file's kernel code that only the strict reading refuses
    (rules with kind "ast" and strict=True). The reading is the call's (`emulator.run(..., reading=)`), so they
    are raised as a kernel launches (loader), not when its file loads."""
    out = []
    for fn in kernel_functions(tree):
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                out.append(("strict.is_none", f"`is None` / `is not None` in {fn.name}", f"{filename}:{node.lineno}"))
    return tuple(out)


def check_source(source: str, filename: str) -> ast.Module:
    """Checks the file's kernel code; returns its syntax tree."""
    tree = ast.parse(source, filename)
    imported = _imports(tree, filename)
    foreign = set(imported)
    legacy = _neuronxcc_names(tree)
    for fn in kernel_functions(tree):
        if any(_is_jit(d) for d in fn.decorator_list):
            _check_signature(fn, filename)
        annotations = _annotation_nodes(fn)
        for node in ast.walk(fn):
            if id(node) in annotations:
                continue
            if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.Is, ast.IsNot)) and not _is_none(left) and not _is_none(right)
                    for op, left, right in zip(node.ops, [node.left, *node.comparators], node.comparators)):
                _fail("ast.is_operator", f"`is` / `is not` (not against None) in {fn.name}", filename, node)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in legacy:
                _fail("ast.neuronxcc_namespace", f"{fn.name} uses {node.id} (module {legacy[node.id]})", filename, node)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in foreign:
                _fail("ast.foreign_module", f"{fn.name} uses {node.id} (module {imported[node.id]})", filename, node)
            if isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and not isinstance(key.value, str):
                        _fail("kernel.dict_keys", f"dictionary key {key.value!r} in {fn.name}", filename, key)
    return tree


DICT_NAME = "__nki_dict__"


class _KernelDicts(ast.NodeTransformer):
    """Kernel code builds its dictionaries through `__nki_dict__` (language.NkiDict: string keys only, checked
    as keys are set), since NKI dictionaries take string keys only."""

    def visit_Dict(self, node):
        self.generic_visit(node)
        if any(k is None for k in node.keys):  # a `**spread` display: its keys are checked where they were set
            return node
        pairs = ast.List([ast.Tuple([k, v], ast.Load()) for k, v in zip(node.keys, node.values)], ast.Load())
        return ast.copy_location(ast.Call(ast.Name(DICT_NAME, ast.Load()), [pairs], []), node)

    def visit_DictComp(self, node):
        self.generic_visit(node)
        gen = ast.GeneratorExp(ast.Tuple([node.key, node.value], ast.Load()), node.generators)
        return ast.copy_location(ast.Call(ast.Name(DICT_NAME, ast.Load()), [gen], []), node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass"):
            return node  # `isinstance(x, dict)` keeps the built-in type (NkiDict is a dict)
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id == "dict" and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Name(DICT_NAME, ast.Load()), node)
        return node


def exec_kernel_code(tree: ast.Module, filename: str, namespace: dict) -> None:
    """Runs the module body in `namespace`, its kernel functions building dictionaries through `__nki_dict__`
    (language.NkiDict, bound in the namespace first)."""
    from kernels_nki.emulator.language import NkiDict

    names = {f.name for f in kernel_functions(tree)}
    body = [_KernelDicts().visit(n) if isinstance(n, ast.FunctionDef) and n.name in names else n for n in tree.body]
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=tree.type_ignores))
    namespace[DICT_NAME] = NkiDict
    exec(compile(module, filename, "exec"), namespace)
