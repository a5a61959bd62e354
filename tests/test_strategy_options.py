"""Strategy options are declared once (each strategy's ``Options``); the checks, the stored
parameters and the CLI's flags all follow from that declaration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pytest
from click.testing import CliRunner

from ragidx.cli import cli
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import OPTION_SPECS, REGISTRY, create_strategy, strategy_from_index
from ragidx.indexer.strategies.options import OptionType, StrategyOptions, option, option_specs

# Options that change each strategy away from its defaults (every strategy with options has some).
GIVEN: dict[str, dict[str, Any]] = {
    "prompteol": {"icl_demo": "A jockey riding a horse.=>Equestrian"},
    "cp": {"prompt": "cot+knowledge", "cp_layer": 1, "cp_alpha": 1, "cp_mode": "nr"},
    "echo": {"query_instruction": "Find the passage"},
    "kv-embedding": {"layers": "1-2", "kv_bias": 0.5},
    "htp": {"rewire": "1-2", "exit_layer": -3, "block_sentences": 2, "sink": "eos"},
    "tp": {"pool": "last", "placeholder_init": "randn"},
    "aligned-wva": {"query_instruction": "Find the passage", "layers": "2,4", "normalize_layers": True},
    "wva": {"prompt": "prompteol"},
    "va": {"layers": "3"},
}
TEXTS = ["A heat pump moves heat instead of making it. It runs on electricity.", "Tides come twice a day."]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_stored_parameters_rebuild_the_same_strategy(name, runtimes):
    """What an index stores (``params``: the resolved options) gives back the same strategy at
    query time: the same parameters and the same document and query vectors."""
    runtime = runtimes["llama"]
    built = create_strategy(name, runtime, **GIVEN.get(name, {}))
    reloaded = strategy_from_index(name, runtime, built.params)
    assert reloaded.params == built.params
    for role in ("document", "query"):
        np.testing.assert_array_equal(reloaded.encode(TEXTS, role), built.encode(TEXTS, role))


def test_given_options_are_checked_against_their_declaration(runtimes):
    runtime = runtimes["llama"]
    for name, options, message in [
        ("htp", {"exit_layer": "3"}, "--exit-layer needs a whole number, got '3'"),
        ("htp", {"block_sentences": 0}, "--block-sentences must be at least 1, got 0"),
        ("cp", {"cp_mode": "xx"}, "unknown --cp-mode 'xx': choose ns or nr"),
        ("va", {"normalize_layers": "yes"}, "--normalize-layers is true or false, got 'yes'"),
        ("kv-embedding", {"kv_bias": "high"}, "--kv-bias needs a number, got 'high'"),
        ("aligned-wva", {"prompt": "poem"}, "unknown --prompt 'poem': choose futureeol, prompteol or none"),
        ("tp", {"block_sentences": 2}, "--block-sentences does not apply to strategy 'tp'"),
    ]:
        with pytest.raises(RagidxError, match=message):
            create_strategy(name, runtime, **options)
    alpha = create_strategy("cp", runtime, cp_alpha=1).params["cp_alpha"]
    assert alpha == 1.0 and isinstance(alpha, float)


def test_each_declared_option_is_one_flag_of_the_cli():
    declared: dict[str, set[str]] = {}
    for name, cls in REGISTRY.items():
        for f in dataclasses.fields(cls.Options):
            if f.metadata["help"] is not None:
                declared.setdefault(f.name, set()).add(name)
    assert {spec.name for spec in OPTION_SPECS} == set(declared)
    for spec in OPTION_SPECS:
        assert all(name in spec.help for name in declared[spec.name]), spec.help
    shown = CliRunner().invoke(cli, ["build", "--help"], terminal_width=200).output
    assert all(f"{spec.flag} " in shown for spec in OPTION_SPECS)
    assert "--normal-templates" not in shown  # stored only: declared without help


@dataclass(frozen=True)
class DepthOptions(StrategyOptions):
    depth: int = option("How deep.", 3, minimum=1)
    style: Literal["a", "b"] = option("Style.", "a")


@dataclass(frozen=True)
class StyleOptions(StrategyOptions):
    style: Literal["a", "c"] = option("Style.", "a")
    table: dict[str, list[str]] | None = option(None)


def test_flags_are_merged_from_every_declaration():
    """One flag per name; a name declared differently keeps each help and lists its choices."""
    specs = option_specs([("one", DepthOptions), ("two", StyleOptions)])
    assert [(s.flag, s.type, s.minimum, s.help) for s in specs] == [
        ("--depth", OptionType(int), 1, "one: How deep (default 3)."),
        ("--style", OptionType(str), None, "one: Style (a|b; default a). two: Style (a|c; default a)."),
    ]
    assert option_specs([("one", DepthOptions), ("three", DepthOptions)])[1].type == OptionType(
        str, ("a", "b")
    )
    with pytest.raises(RagidxError, match="--depth does not apply to strategy 'two'"):
        StyleOptions.given({"depth": 2}, "two")
    assert DepthOptions.given({"depth": 2, "style": None}, "one") == DepthOptions(depth=2)
