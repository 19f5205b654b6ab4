"""The import graph of a source tree, read from its AST (nothing is imported), and the cycles in it.

An import anywhere in a module counts, a lazy one inside a function too: it is a cycle waiting for its caller.
One under `if TYPE_CHECKING:` does not: it never runs. An edge goes to the module an import names (`from a
import b` to `a.b` where `b` is a module, else to `a`), not to the packages above it, whose `__init__` Python
runs first but which a package's own modules import as a matter of course.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Mapping
from pathlib import Path


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every .py under `root / package` (a package is its __init__)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imported_names(name: str, path: Path) -> set[str]:
    """Every name module `name` (at `path`) imports, relative ones resolved: `import a.b` as `a.b`, `from a import
    b` as `a.b` (a module or a name in `a`); `from __future__` is left out."""
    out = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif node.module != "__future__":
            base = _base(name, path, node)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports."""
    # `from a import b` imports module a.b when there is one, else a name of module a.
    targets = {t if t in known else t.rpartition(".")[0] for t in imported_names(name, path)}
    return {t for t in targets if t in known and t != name}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module → the modules it imports, both inside `packages` (paths like "gpumond/nvml")."""
    known: dict[str, Path] = {}
    for package in packages:
        known |= module_names(root, package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def private_imports(root: Path, packages: Iterable[str]) -> list[str]:
    """`module: from other import _name` for each private name a module takes from another of `packages`."""
    known: dict[str, Path] = {}
    for package in packages:
        known |= module_names(root, package)
    out = []
    for name, path in known.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and _base(name, path, node) in known:
                out += [f"{name}: from {_base(name, path, node)} import {a.name}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out
