"""The import rules of the code's layout: cli -> app -> indexer, and local imports only where
they keep start-up fast or an optional extra optional (tests/benchmarks/module_graph.py prints
the graph these rules read)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
from module_graph import ModuleImports, graph, read_imports

# Imported inside functions only: heavy on start-up (the model stack, or >= 10 ms each measured
# with `python -X importtime` on the development machine) or an optional extra that may be absent.
HEAVY = {"torch", "transformers", "huggingface_hub", "faiss", "spacy", "sentence_transformers", "gguf"}
SLOW = {"sqlite_utils", "bs4", "tqdm", "snowballstemmer", "unittest", "charset_normalizer", "yaml", "psutil"}
OPTIONAL_EXTRAS = {
    "pypdf",
    "docx",
    "uvicorn",
    "fastapi",
    "mcp",
    "watchfiles",
    "matplotlib",
    "ray",
    "pymilvus",
    "milvus_lite",
}
# cli imports the server and MCP modules only when asked: each needs its optional extra.
LOCAL_OWN_IMPORTS = {"cli": {"app.server", "app.mcp_server"}}


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
        if layer(target) not in allowed[layer(module.name)]
    ]
    assert not wrong


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
        "def f():\n    import torch\n    from ragidx.indexer.store import IndexReader\n"
    )
    found = read_imports(source, tmp_path)
    assert (found.name, found.top, found.local, found.local_third_party) == (
        "indexer.example",
        {"indexer"},
        {"indexer.store"},
        {"torch"},
    )
