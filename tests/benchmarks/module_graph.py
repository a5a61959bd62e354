"""Who imports whom inside ragidx, read from the source (nothing is imported).

Usage: python -m tests.benchmarks.module_graph [--local] [--root CHECKOUT]

Prints one line per module: the ragidx modules it imports at the top, then, after "|", those it
imports inside functions (``--local`` lists every function-local import, third-party included),
and line counts per package, then every cycle of imports between modules (type-only ones
included: they are a cycle a reader has to follow too). tests/test_layout.py holds the rules this
graph must keep.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "ragidx"


@dataclass
class ModuleImports:
    name: str
    lines: int
    top: set[str] = field(default_factory=set)  # ragidx modules imported at module level
    local: set[str] = field(default_factory=set)  # ... inside a function
    local_third_party: set[str] = field(default_factory=set)
    typed: set[str] = field(default_factory=set)  # ... under ``if TYPE_CHECKING:`` (never run)


def source_files(root: Path = ROOT) -> Iterator[Path]:
    yield root / "__main__.py"
    yield root / "cli.py"
    for folder in ("app", "indexer"):
        yield from sorted((root / folder).rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """What the statement imports: ``from a.b import c`` names ``a.b`` and ``a.b.c`` (a module, where
    ``c`` is one; :func:`cycles` keeps only the names of modules)."""
    if isinstance(node, ast.ImportFrom):
        return [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
    return [alias.name for alias in node.names]


def read_imports(path: Path, root: Path = ROOT) -> ModuleImports:
    """Imports of one file, split by where they stand; ``if TYPE_CHECKING:`` blocks are skipped
    (they never run)."""
    source = path.read_text(encoding="utf-8")
    found = ModuleImports(module_name(path, root), len(source.splitlines()))

    modules = {module_name(path, root) for path in source_files(root)} | {""}

    def visit(node: ast.AST, in_function: bool, typed: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                record(child, in_function, typed)
            typed_block = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            in_def = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, in_def, typed or typed_block)

    def record(statement: ast.Import | ast.ImportFrom, in_function: bool, typed: bool) -> None:
        names = imported_names(statement)
        for name in names:
            own = name == PACKAGE or name.startswith(PACKAGE + ".")
            short = name.removeprefix(PACKAGE).removeprefix(".")
            if (own and short in modules) or (own and name == names[0]):
                (found.typed if typed else found.local if in_function else found.top).add(short or PACKAGE)
            elif not own and in_function and not typed and name == names[0]:
                found.local_third_party.add(name.split(".")[0])

    visit(ast.parse(source), False, False)
    return found


def package_of(module: str, root: Path = ROOT) -> str:
    """``cli``, ``app``, ``indexer`` or a subpackage such as ``indexer.strategies``."""
    parts = module.split(".")
    is_subpackage = len(parts) > 2 or (len(parts) == 2 and (root / parts[0] / parts[1]).is_dir())
    return ".".join(parts[:2]) if is_subpackage else parts[0]


def graph(root: Path = ROOT) -> list[ModuleImports]:
    return [read_imports(path, root) for path in source_files(root)]


def cycles(modules: list[ModuleImports]) -> list[list[str]]:
    """Every set of modules that import one another round in a circle (strongly connected
    components of two or more, or one importing itself), each sorted; imports of any kind count."""
    edges = {m.name: (m.top | m.local | m.typed) & {n.name for n in modules} for m in modules}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(name: str) -> None:  # Tarjan's algorithm
        order[name] = low[name] = len(order)
        stack.append(name)
        for target in edges[name]:
            if target not in order:
                connect(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], order[target])
        if low[name] == order[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1 or name in edges[name]:
                found.append(sorted(component))

    for name in edges:
        if name not in order:
            connect(name)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local", action="store_true", help="list third-party function-local imports too")
    parser.add_argument("--root", type=Path, default=ROOT, help="a checkout to read (default: this one)")
    args = parser.parse_args()
    modules = graph(args.root)
    for module in modules:
        line = f"{module.name} ({module.lines}): {', '.join(sorted(module.top)) or '-'}"
        if module.local:
            line += f" | local: {', '.join(sorted(module.local))}"
        if args.local and module.local_third_party:
            line += f" | third-party local: {', '.join(sorted(module.local_third_party))}"
        print(line)
    totals: dict[str, int] = {}
    for module in modules:
        package = package_of(module.name, args.root)
        totals[package] = totals.get(package, 0) + module.lines
    per_package = ", ".join(f"{name} {count}" for name, count in totals.items())
    print(f"lines: {per_package}, total {sum(totals.values())}")
    own_local = sum(len(module.local) for module in modules)
    print(f"function-local imports of ragidx modules (distinct per module): {own_local}")
    for cycle in cycles(modules):
        print(f"cycle: {' -> '.join(cycle)}")


if __name__ == "__main__":
    main()
