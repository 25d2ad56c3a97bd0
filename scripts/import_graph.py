"""Print the import graph of our packages: modules, edges, cycles, imports inside functions.

Read from the source (``ast``), not by importing, so an import inside a function counts
as an edge like one at module level: a deferred import hides a dependency from the
reader, not from the layering. An edge ``a -> b`` means ``a`` names ``b`` in an
``import`` or ``from b import ...`` (or ``from b import c`` where ``b.c`` is a module,
which gives ``a -> b.c``); a package's own ``__init__`` is not implied by importing one of
its submodules, as in import-linter and pydeps. The lazy facade of ``aicf_tvm/__init__.py``
(its ``_LAZY`` table: public name -> module, imported on first use) counts as edges
too, marked ``facade``. ``tests/test_imports.py`` checks the layering (docs/design.md §8)
on this graph.

    python -m scripts.import_graph            # summary: counts, cycles, deferred imports
    python -m scripts.import_graph --edges    # every edge, with where it is deferred
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aicf_tvm", "relax_passes", "schedules")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    deferred: bool  # inside a function body, not run at import time
    facade: bool = False  # an entry of the package's lazy ``_LAZY`` table


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((root / pkg).rglob("*.py"))
    }


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside (``a.b.c`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _base(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    anchor = module.split(".")
    if not is_package:
        anchor = anchor[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join(anchor + ([name] if name else []))


def _deferred_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    lines.add(inner.lineno)
    return lines


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` never run, so they are no edge."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def facade_table(tree: ast.Module) -> dict[str, tuple[str, int]]:
    """``{public name: (relative module, line)}`` of a module-level ``_LAZY = {...}``."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {k.value: (v.value, k.lineno) for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def deferred_import_count(known: dict[str, Path] | None = None) -> int:
    """Import statements inside functions, of any module (ours, TVM, optional packages)."""
    known = modules() if known is None else known
    return sum(len(_deferred_lines(ast.parse(p.read_text()))) for p in known.values())


def edges(known: dict[str, Path] | None = None) -> list[Edge]:
    known = modules() if known is None else known
    out: list[Edge] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        deferred = _deferred_lines(tree)
        skipped = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base(module, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for target in targets:
                resolved = _resolve(target, known)
                if resolved and resolved != module:
                    out.append(Edge(module, resolved, node.lineno, node.lineno in deferred))
        for relative, line in facade_table(tree).values():
            level = len(relative) - len(relative.lstrip("."))
            target = _base(module, is_package, level, relative.lstrip(".") or None)
            out.append(Edge(module, target, line, True, facade=True))
    return sorted(set(out), key=lambda e: (e.source, e.target, e.line))


def cycles(graph_edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    succ: dict[str, set[str]] = {}
    for e in graph_edges:
        succ.setdefault(e.source, set()).add(e.target)
        succ.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="list every edge")
    args = parser.parse_args()
    known = modules()
    graph = edges(known)
    deferred = [e for e in graph if e.deferred]
    print(f"modules  {len(known)}")
    print(f"edges    {len(graph)} ({len(deferred)} inside functions)")
    found = cycles(graph)
    print(f"imports inside functions (any module): {deferred_import_count(known)}")
    print(f"cycles   {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    print("imports of our modules inside functions (facade: the lazy public API):")
    for e in deferred:
        print(f"  {e.source}:{e.line} -> {e.target}{'  (facade)' if e.facade else ''}")
    if args.edges:
        print("edges:")
        for e in graph:
            where = "  (facade)" if e.facade else "  (in a function)" if e.deferred else ""
            print(f"  {e.source} -> {e.target}{where}")


if __name__ == "__main__":
    main()
