"""The import rules of the code's layout: cli -> app -> indexer, and local imports only where
they keep start-up fast or an optional extra optional (tests/benchmarks/module_graph.py prints
the graph these rules read)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.benchmarks.module_graph import ROOT, ModuleImports, graph, package_of, read_imports

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
        "app.server",
        "app.scheduler",
        "app.mcp_server",
        "app.mcp_stdio",
        "app.daemon",
        "app.command_server",
        "app.research.bench",
        "app.research.calibrate",
        "app.research.evaluation",
        "app.research.plots",
    },
    "app.launcher": {"cli"},  # the console script: the CLI where the command server takes nothing
    # a request answered here, where no daemon answers: the model stack, loaded only then
    "app.index_request": {"app.operations", "app.retriever", "app.scheduler", "app.served_index"},
}
# The one import against the flow: the console script runs the CLI, when it runs here at all.
UPWARD = {("app.launcher", "cli")}


@pytest.fixture(scope="module")
def modules() -> list[ModuleImports]:
    return graph()


def layer(module: str) -> str:
    return module.split(".")[0]


def test_imports_run_one_way_from_cli_to_app_to_indexer(modules):
    allowed = {"cli": {"cli", "app", "indexer", "ragidx"}, "app": {"app", "indexer", "ragidx"}}
    allowed["indexer"] = {"indexer", "ragidx"}
    wrong = [
        f"{module.name} imports {target}"
        for module in modules
        for target in module.top | module.local
        if layer(target) not in allowed[layer(module.name)] and (module.name, target) not in UPWARD
    ]
    assert not wrong


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
        for target in module.top | module.local
        if layer(target) == "indexer"
        and package_of(target) not in ENGINE_LAYERS[package_of(module.name)] | {package_of(module.name)}
    ]
    assert not wrong
    top = [m.name for m in modules if package_of(m.name) == "indexer"]
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_cli_reaches_the_engine_only_through_the_app(modules):
    """The commands parse, call ragidx.app (Index, Embedder, catalog, research) and print; of the
    engine they read only the wording helpers they print with."""
    cli = next(module for module in modules if module.name == "cli")
    assert {target for target in cli.top | cli.local if layer(target) == "indexer"} == {"indexer.wording"}


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
    assert (found.name, found.top, found.local, found.local_third_party) == (
        "indexer.example",
        {"indexer"},
        {"indexer.storage"},
        {"torch"},
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


def test_only_the_storage_package_knows_which_vector_store_an_index_uses():
    """Stores are reached through indexer/storage/vector_store.py's protocols and the factory in
    stores.py (mypy checks that both stores implement them): no code outside storage names one."""
    named = re.compile(
        r"MilvusLocation|isinstance\(.*Milvus|SegmentStore"
        r"|storage\.(segment_store|segments|milvus)\b|\"kind\"\] =="
    )
    outside = [ROOT / "cli.py", *(ROOT / "app").rglob("*.py")]
    outside += [path for path in (ROOT / "indexer").rglob("*.py") if "storage" not in path.parts]
    assert not [str(path) for path in outside if named.search(path.read_text(encoding="utf-8"))]
