"""Load a kernel file from a source checkout (a package tree such as AWS's nki-library) against the emulated nki.

`load_kernel_file(path)` executes the file as module `<package>.<...>.<name>` of its package tree, so the
package-relative imports AWS's library kernels use (`from ..utils.kernel_helpers import div_ceil`) resolve
to the checkout's files. Every file of that package tree a kernel file imports is checked by the AST pass
and executed against the emulated `nki` like the kernel file itself (the NKI compiler inlines what a kernel
calls: aws-neuron-sdk `nki/get-started/nki-language-guide.rst`, "Composable Kernels"). A package's
`__init__.py` is not executed: it is import glue of the installed library (nki-library's top `__init__`
swaps modules by environment variable), not kernel code; its package stands as a bare namespace.

Nothing stays behind: the package's modules and the emulated `nki` are in `sys.modules` only while the file
loads (a module the file binds keeps working: its globals hold the emulated objects). Refused, like
`load_kernel_module`, when a real `nki` is importable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

from kernels_nki.emulator import ast_pass, loader

_cache: dict[tuple[str, str], types.ModuleType] = {}
_OWN = __name__.split(".")[0]  # the emulator's own package: never re-imported from a checkout


def package_root(path: str) -> str:
    """The directory above the topmost package (a directory with `__init__.py`) that holds `path`."""
    root = os.path.dirname(os.path.abspath(path))
    while os.path.isfile(os.path.join(root, "__init__.py")):
        root = os.path.dirname(root)
    return root


def module_name(path: str, root: str) -> str:
    rel = os.path.relpath(os.path.abspath(path), root)
    if rel.startswith(".."):
        raise ValueError(f"{path} is not under {root}")
    return rel[:-3].replace(os.sep, ".") if rel.endswith(".py") else rel.replace(os.sep, ".")


class _EmulatedSource(importlib.abc.Loader):
    """Executes a checkout file after the AST pass, against the nki installed in sys.modules by the caller."""

    def __init__(self, path: str | None):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__nki_emulated__ = True
        if self.path is None:  # a package: a bare namespace (its __init__ is install glue, not kernel code)
            return
        with open(self.path, encoding="utf-8") as f:
            source = f.read()
        tree = ast_pass.check_source(source, self.path)
        ast_pass.exec_kernel_code(tree, self.path, module.__dict__)
        setattr(module, ast_pass.STRICT_SOURCE, ast_pass.strict_findings(tree, self.path))


def _tops(root: str, top: str) -> set[str]:
    """The kernel file's top-level package or module and its siblings under `root` (modules and packages): a
    script-style kernel file (AWS's nki-samples mx_kernels.py: `from mx_kernel_utils import ...`) imports those."""
    names = {top}
    for entry in os.listdir(root):
        if entry == _OWN:
            continue
        path = os.path.join(root, entry)
        if entry.endswith(".py") and entry[:-3].isidentifier():
            names.add(entry[:-3])
        elif entry.isidentifier() and os.path.isfile(os.path.join(path, "__init__.py")):
            names.add(entry)
    return names


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of the top-level packages / modules `tops` under `root`."""

    def __init__(self, root: str, tops: set[str]):
        self.root, self.tops = root, tops

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.tops:
            return None
        base = os.path.join(self.root, *fullname.split("."))
        if os.path.isdir(base):
            spec = importlib.machinery.ModuleSpec(fullname, _EmulatedSource(None), is_package=True)
            spec.submodule_search_locations = [base]
            return spec
        if os.path.isfile(base + ".py"):
            spec = importlib.machinery.ModuleSpec(fullname, _EmulatedSource(base + ".py"), origin=base + ".py")
            spec.has_location = True
            return spec
        return None


def load_kernel_file(path: str, root: str | None = None) -> types.ModuleType:
    """The kernel file at `path` executed against the emulated nki as a module of its package tree under
    `root` (default: `package_root(path)`); cached per (root, module)."""
    root = os.path.abspath(root or package_root(path))
    name = module_name(path, root)
    top = name.split(".")[0]
    if top == _OWN:
        raise ValueError(f"{path} is a module of {_OWN}: load it with load_kernel_module({name!r})")
    with loader._lock:
        if loader.real_nki_present():
            raise loader.EmulatorConflictError(
                "a real `nki` package is importable: the NumPy emulator refuses to stand in for it "
                "(use nki.simulate with the real package)")
        if (root, name) in _cache:
            return _cache[(root, name)]
        tops = _tops(root, top)
        ours = lambda k: k.split(".")[0] in tops  # noqa: E731
        saved = {k: v for k, v in sys.modules.items() if ours(k)}
        finder = _CheckoutFinder(root, tops)
        with loader.emulated_nki():
            for k in saved:
                del sys.modules[k]
            sys.meta_path.insert(0, finder)
            try:
                module = importlib.import_module(name)
            finally:
                sys.meta_path.remove(finder)
                for k in [k for k in sys.modules if ours(k)]:
                    del sys.modules[k]
                sys.modules.update(saved)
        _cache[(root, name)] = module
        return module
