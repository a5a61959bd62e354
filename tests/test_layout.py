"""The import rules of the code's layout: __main__ -> cli -> app.commands -> app -> indexer, no
cycles, and local imports only where they keep start-up fast or an optional extra optional
(tests/benchmarks/module_graph.py prints the graph these rules read); and the tests' own: helpers
shared through tests/support, never one test module importing another."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.benchmarks.module_graph import ROOT, ModuleImports, cycles, graph, package_of, read_imports

# Imported inside functions only: heavy on start-up (the model stack, or >= 10 ms each measured
# with `python -X importtime` on the development machine) or an optional extra that may be absent.
HEAVY = {
    "torch",
    "transformers",
    "huggingface_hub",
    "faiss",
    "spacy",
    "sentence_transformers",
    "gguf",
    "safetensors",  # safetensors.torch, which imports torch
}
SLOW = {
    "numpy",  # 45-85 ms: the CLI's start-up (ragidx query through the daemon) does without it
    "subprocess",  # 1.4 ms, only to start the daemon: a query to a running one does without it
    "sqlite_utils",
    "bs4",
    "tqdm",
    "snowballstemmer",
    "py3langid",  # its model loads in 0.4 s: only where a language must be told
    "unittest",
    "charset_normalizer",
    "yaml",
    "psutil",
}
OPTIONAL_EXTRAS = {
    "pypdf",
    "docx",
    "uvicorn",
    "fastapi",
    "mcp",
    "anyio",  # with mcp
    "watchfiles",
    "matplotlib",
    "ray",
    "pymilvus",
    "milvus_lite",
}
# cli imports the server and MCP modules only when asked: each needs its optional extra.
# The CLI starts without numpy or torch (ragidx --help, a query through the daemon); the modules
# that load them are imported by the one command that needs them.
LOCAL_OWN_IMPORTS = {
    "cli": {
        "app.http.server",
        "app.service.scheduler",
        "app.mcp.server",
        "app.mcp.stdio",
        "app.daemon.server",
        "app.daemon.command_server",
    },
    "app.commands.research": {
        "app.research.bench",
        "app.research.calibrate",
        "app.research.evaluation",
        "app.research.plots",
    },
    "__main__": {"cli"},  # the console script: the CLI where the command server takes nothing
    # a request answered here, where no daemon answers: the model stack, loaded only then
    "app.daemon.index_request": {
        "app.service.operations",
        "app.retriever",
        "app.service.scheduler",
        "app.service.served_index",
    },
}


@pytest.fixture(scope="module")
def modules() -> list[ModuleImports]:
    return graph()


def layer(module: str) -> str:
    """``__main__``, ``cli``, ``app.commands`` (the rest of the command line), ``app`` or ``indexer``."""
    return "app.commands" if module.startswith("app.commands") else module.split(".")[0]


# Highest first: each may import its own layer and those below it, never one above.
LAYERS = ("__main__", "cli", "app.commands", "app", "indexer")


def test_imports_run_one_way_from_the_script_to_the_cli_to_app_to_indexer(modules):
    """Type-only imports included: an import up the layers is one a reader must follow up too."""
    rank = {name: number for number, name in enumerate(LAYERS)}
    wrong = [
        f"{module.name} imports {target}"
        for module in modules
        for target in module.top | module.local | module.typed
        if target != "ragidx" and rank[layer(target)] < rank[layer(module.name)]
    ]
    assert not wrong


def test_no_modules_import_each_other_round_in_a_circle(modules):
    assert cycles(modules) == []


def test_the_cycle_finder_sees_a_circle_closed_by_a_type_only_import():
    a = ModuleImports("indexer.model.a", 1, top={"indexer.model.b"})
    b = ModuleImports("indexer.model.b", 1, top={"indexer.model.c"})
    c = ModuleImports("indexer.model.c", 1, typed={"indexer.model.a"})
    alone = ModuleImports("indexer.model.d", 1, top={"indexer.model.a"})
    assert cycles([a, b, c, alone]) == [["indexer.model.a", "indexer.model.b", "indexer.model.c"]]


def test_the_everyday_commands_fit_in_cli_py():
    """Research commands, shared options and output live in app/commands/ (docs/development.md)."""
    assert len((ROOT / "cli.py").read_text(encoding="utf-8").splitlines()) <= 900


# The engine's flow, ingest -> model -> strategies -> storage -> search -> build: what each package may
# import besides itself ("indexer" is the shared modules at its top: errors, wording, faults, cache,
# progress). Storage never reads search or build, search never reads build, and nothing but build
# reads the strategies' choices or a build's settings.
ENGINE_LAYERS = {
    "indexer": set(),
    "indexer.ingest": {"indexer"},
    "indexer.model": {"indexer"},
    "indexer.strategies": {"indexer", "indexer.ingest", "indexer.model"},
    "indexer.storage": {"indexer", "indexer.ingest"},
    "indexer.search": {"indexer", "indexer.ingest", "indexer.model", "indexer.storage"},
    "indexer.build": {
        "indexer",
        "indexer.ingest",
        "indexer.model",
        "indexer.strategies",
        "indexer.storage",
        "indexer.search",
    },
}
MAX_TOP_MODULES = 8  # indexer's own modules besides its sub-packages, __init__ included


def test_the_engine_is_in_sub_packages_that_import_one_way(modules):
    packages = {package_of(m.name) for m in modules if layer(m.name) == "indexer"}
    assert packages == set(ENGINE_LAYERS)
    wrong = [
        f"{module.name} imports {target}"
        for module in modules
        if layer(module.name) == "indexer"
        for target in module.top | module.local | module.typed
        if layer(target) == "indexer"
        and package_of(target) not in ENGINE_LAYERS[package_of(module.name)] | {package_of(module.name)}
    ]
    assert not wrong
    top = [m.name for m in modules if package_of(m.name) == "indexer"]
    assert len(top) <= MAX_TOP_MODULES, top


# Inside app: the transports (HTTP, the daemon, MCP, the frameworks' adapters) above the service
# layer that serves an index to many clients (scheduler, served index, operations, request types),
# above the library API (Index, Embedder, generation, answering, reranking, the catalog) at app's
# top; research and the command line above the library. What each package may import besides itself.
APP_LAYERS = {
    "app": set(),
    "app.service": {"app"},
    "app.http": {"app", "app.service"},
    "app.daemon": {"app", "app.service"},
    "app.mcp": {"app", "app.service"},
    "app.integrations": {"app", "app.service", "app.daemon"},  # the llm plugin asks the daemon
    "app.research": {"app"},
    "app.commands": {"app", "app.research"},
}


def test_app_is_in_sub_packages_that_import_one_way(modules):
    in_app = [m for m in modules if layer(m.name) in ("app", "app.commands")]
    assert {package_of(m.name) for m in in_app} == set(APP_LAYERS)
    wrong = [
        f"{module.name} imports {target}"
        for module in in_app
        for target in module.top | module.local | module.typed
        if layer(target) in ("app", "app.commands")
        and package_of(target) not in APP_LAYERS[package_of(module.name)] | {package_of(module.name)}
    ]
    assert not wrong


def test_the_command_line_reaches_the_engine_only_through_the_app(modules):
    """The commands (cli.py and app/commands/) parse, call ragidx.app (Index, Embedder, catalog,
    research) and print; of the engine they read only the wording helpers they print with."""
    command_line = [m for m in modules if layer(m.name) in ("cli", "app.commands")]
    assert len(command_line) >= 4
    read = {
        target for m in command_line for target in m.top | m.local | m.typed if layer(target) == "indexer"
    }
    assert read == {"indexer.wording"}


def test_only_optional_entry_points_import_ragidx_modules_inside_functions(modules):
    wrong = {m.name: m.local for m in modules if m.local - LOCAL_OWN_IMPORTS.get(m.name, set())}
    assert not wrong


def test_third_party_imports_inside_functions_are_heavy_slow_or_optional(modules):
    allowed = HEAVY | SLOW | OPTIONAL_EXTRAS
    wrong = {m.name: m.local_third_party - allowed for m in modules if m.local_third_party - allowed}
    assert not wrong


def test_the_graph_reader_sees_each_kind_of_import(tmp_path):
    (tmp_path / "indexer").mkdir()
    source = tmp_path / "indexer" / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ragidx.indexer import errors\n"
        "if TYPE_CHECKING:\n    from ragidx.app import Index\n"
        "def f():\n    import torch\n    from ragidx.indexer.storage import IndexReader\n"
    )
    found = read_imports(source, tmp_path)
    assert (found.name, found.top, found.local, found.local_third_party, found.typed) == (
        "indexer.example",
        {"indexer"},
        {"indexer.storage"},
        {"torch"},
        {"app"},
    )


def test_the_wheel_ships_and_imports_every_package(tmp_path):
    """pyproject lists the packages by hand (the checkout's root is the ``ragidx`` package): a
    sub-package left out of that list would be missing from every install but an editable one."""
    source = tmp_path / "source"  # a copy: an in-tree build would leave build/ in the checkout

    def left_out(folder: str, names: list[str]) -> set[str]:
        at_root = Path(folder) == ROOT
        return {
            name
            for name in names
            if name.startswith(".")
            or name == "__pycache__"
            or (at_root and name in ("tests", "build", "dist"))
        }

    shutil.copytree(ROOT, source, ignore=left_out)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path,
            source,
        ],
        check=True,
        capture_output=True,
    )
    site = tmp_path / "site"
    with zipfile.ZipFile(next(tmp_path.glob("ragidx-*.whl"))) as wheel:
        shipped = set(wheel.namelist())
        wheel.extractall(site)
    sources = [
        ROOT / "__main__.py",
        ROOT / "cli.py",
        *(path for folder in ("app", "indexer") for path in (ROOT / folder).rglob("*.py")),
    ]
    expected = {"ragidx/" + path.relative_to(ROOT).as_posix() for path in sources}
    assert not expected - shipped
    packages = sorted({f"ragidx.{package_of(module.name)}" for module in graph()})
    script = (
        "import importlib, sys\n"
        f"for name in {packages!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(site)!r}), module.__file__\n"
    )
    subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}
    )


def test_storage_reads_of_ingest_only_the_spans_it_stores(modules):
    """Text extraction (ingest/sources) stays out of storage's way: a chunk's spans and the pages
    they touch are :mod:`ragidx.indexer.ingest.spans`', the language a text is in and how it is
    stemmed :mod:`ragidx.indexer.ingest.languages`', which files may be opened again (an index's
    settings store its roots and size bound) :mod:`ragidx.indexer.ingest.access`' (types it stores
    may be named for mypy)."""
    read = {
        target
        for m in modules
        if package_of(m.name) == "indexer.storage"
        for target in m.top | m.local
        if package_of(target) == "indexer.ingest"
    }
    allowed = {"indexer.ingest", "indexer.ingest.spans", "indexer.ingest.languages", "indexer.ingest.access"}
    assert read <= allowed


def test_each_vector_store_is_a_sub_package_that_alone_knows_its_files():
    """``STORE_KINDS`` names ``storage/<kind>/``; only a store's own files spell its file names
    (the local store's ``vectors-*.faiss``), so the writer, reader and check go through it."""
    from ragidx.indexer.storage.stores import STORE_KINDS

    for kind, target in STORE_KINDS.items():
        assert target.startswith(f"ragidx.indexer.storage.{kind}."), target
        assert (ROOT / "indexer" / "storage" / kind / "__init__.py").is_file()
    spelled = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "indexer").rglob("*.py")
        if "local" not in path.parts and re.search(r"vectors-[^\s]*\.faiss", path.read_text(encoding="utf-8"))
    ]
    assert not spelled


def test_no_test_module_imports_another_and_nothing_edits_the_import_path():
    """Helpers the tests share live in tests/support (and are imported as ``tests.support.*``);
    the one ``sys.path`` edit left is segment_update's ``--root``, which measures another checkout."""
    tests = ROOT / "tests"
    # a test module by any name, or a helper or benchmark by its bare name (found only where some
    # other module had put its folder on the path)
    bare = {path.stem for path in tests.rglob("*.py")} | {"support", "benchmarks"}
    imported: dict[str, set[str]] = {}
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            hits = {n for n in names if n.split(".")[-1].startswith("test_") or n.split(".")[0] in bare}
            if hits:
                imported[path.relative_to(ROOT).as_posix()] = hits
    assert not imported
    edits = [
        path.relative_to(ROOT).as_posix()
        for path in tests.rglob("*.py")
        if re.search(r"sys\.path\.(insert|append)", path.read_text(encoding="utf-8"))
    ]
    assert edits == ["tests/benchmarks/segment_update.py"]


def test_only_the_storage_package_knows_which_vector_store_an_index_uses():
    """Stores are reached through indexer/storage/vector_store.py's protocols and the factory in
    stores.py (mypy checks that both stores implement them): no code outside storage names one."""
    named = re.compile(
        r"MilvusLocation|isinstance\(.*Milvus|SegmentStore"
        r"|storage\.(local|milvus)\b|\"kind\"\] =="
    )
    outside = [ROOT / "cli.py", *(ROOT / "app").rglob("*.py")]
    outside += [path for path in (ROOT / "indexer").rglob("*.py") if "storage" not in path.parts]
    assert not [str(path) for path in outside if named.search(path.read_text(encoding="utf-8"))]
