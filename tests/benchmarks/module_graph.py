"""Who imports whom inside ragidx, read from the source (nothing is imported).

Usage: python -m tests.benchmarks.module_graph [--local] [--root CHECKOUT]

Prints one line per module: the ragidx modules it imports at the top, then, after "|", those it
imports inside functions (``--local`` lists every function-local import, third-party included),
and line counts per package. tests/test_layout.py holds the rules this graph must keep.
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


def source_files(root: Path = ROOT) -> Iterator[Path]:
    yield root / "cli.py"
    for folder in ("app", "indexer"):
        yield from sorted((root / folder).rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [alias.name for alias in node.names]


def read_imports(path: Path, root: Path = ROOT) -> ModuleImports:
    """Imports of one file, split by where they stand; ``if TYPE_CHECKING:`` blocks are skipped
    (they never run)."""
    source = path.read_text(encoding="utf-8")
    found = ModuleImports(module_name(path, root), len(source.splitlines()))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name in imported_names(child):
                    own = name == PACKAGE or name.startswith(PACKAGE + ".")
                    if own:
                        (found.local if in_function else found.top).add(name.removeprefix(PACKAGE + "."))
                    elif in_function:
                        found.local_third_party.add(name.split(".")[0])
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(source), False)
    return found


def package_of(module: str, root: Path = ROOT) -> str:
    """``cli``, ``app``, ``indexer`` or a subpackage such as ``indexer.strategies``."""
    parts = module.split(".")
    is_subpackage = len(parts) > 2 or (len(parts) == 2 and (root / parts[0] / parts[1]).is_dir())
    return ".".join(parts[:2]) if is_subpackage else parts[0]


def graph(root: Path = ROOT) -> list[ModuleImports]:
    return [read_imports(path, root) for path in source_files(root)]


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


if __name__ == "__main__":
    main()
