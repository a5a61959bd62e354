"""Options several commands share, each declared once: the model and device, the strategy options
(from their declarations in :mod:`ragidx.app.catalog`), build, search and report options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragidx.app import catalog
from ragidx.app.catalog import (
    CPU_ROWS,
    CPU_TOKENS,
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_DECODER,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MODEL,
    DEVICES,
    DTYPES,
    FILTER_HELP,
    FILTER_KINDS,
    FLAT_SCAN_BYTES,
    GPU_MAX_TOKENS,
    INDEX_TYPES,
    ROW_TOKENS,
    SEARCH_OPTION_SPECS,
    STORES,
    VECTOR_INDEX,
    SearchOptionSpec,
    parse_meta,
)

if TYPE_CHECKING:
    from ragidx.app.catalog import OptionSpec


MODEL_HELP = (
    "Model: a short name of a packaged model (see `ragidx models`), a .gguf file, a model folder, or a "
    "Hugging Face hub id"
)


DEFAULT_MODEL_SHOWN = f"$RAGIDX_MODEL or {DEFAULT_MODEL}"
DEFAULT_MODEL_CHOSEN = f"{DEFAULT_MODEL_SHOWN}; {DEFAULT_DECODER} for a strategy that needs a decoder"


trust_remote_code_option = click.option(
    "--trust-remote-code", is_flag=True, help="Allow model code from the hub to run."
)


class LateHelpOption(click.Option):
    """An option whose help names a default that lives in a module the command line does not
    import to parse (the strategies, tuning): ``help_of`` writes it whenever the help is read
    (``--help``, and the generated command reference)."""

    def __init__(self, *args: Any, help_of: Callable[[], str], **kwargs: Any):
        self.help_of = help_of
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str | None:
        return self.help_of()

    @help.setter
    def help(self, _: str | None) -> None:
        """click sets the help it was given (none): what it shows comes from ``help_of``."""


def strategy_defaults_shown(attribute: str) -> str:
    """``default 512; echo: 1024; htp: 8192``: a per-strategy default as help shows it."""
    common, others = catalog.strategy_defaults(attribute)
    return "; ".join([f"default {common}", *(f"{name}: {value}" for name, value in others.items())])


def index_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--index",
        "index_dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Index directory (default $RAGIDX_INDEX or ./.ragidx).",
    )(command)


device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", help="Where the model runs."
)


def device_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default=None,
        help=(
            "Model precision (auto: bf16 on CUDA; on a CPU, what is measured fastest of bf16 (with bf16 "
            "instructions), float32 and float16 weights, then leaner weights where those would take over "
            "a sixth of memory or not fit. On a CPU, float16 and int8 hold float16 or int8 weights and "
            "compute in float32: half and under a third of float32's memory)."
        ),
    )(command)
    return device_option(command)


def click_settings(spec: OptionSpec) -> dict[str, Any]:
    """The click keyword arguments of a strategy option's flag, from its declaration."""
    kind, choices = spec.type.kind, spec.type.choices
    if kind is bool:
        return {"is_flag": True, "help": spec.help}
    if choices:
        return {"type": click.Choice(choices), "help": spec.help}
    if kind is int and spec.minimum is not None:
        return {"type": click.IntRange(min=spec.minimum), "help": spec.help}
    return {"type": kind, "help": spec.help}


TEMPLATE_OPTION_SPECS: list[tuple[str, dict[str, Any]]] = [
    ("--document-template", {"help": "Override the strategy's document template ({text} slot)."}),
    ("--query-template", {"help": "Override the strategy's query template ({text} slot)."}),
]


def add_options(specs: list[tuple[str, dict[str, Any]]], command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, settings in reversed(specs):
        command = click.option(flag, default=None, **settings)(command)
    return command


def template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    return add_options(TEMPLATE_OPTION_SPECS, command)


def swept_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``eval``'s form of an option: each may be repeated, and every combination of the repeated
    values becomes a row (a flag applies to every row)."""
    if settings.get("is_flag"):
        return {**settings, "default": None}
    return {**settings, "multiple": True, "help": settings["help"] + " Repeat to sweep."}


def swept_template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, settings in reversed(TEMPLATE_OPTION_SPECS):
        command = click.option(flag, **swept_settings(settings))(command)
    return command


class StrategyOptionsCommand(click.Command):
    """A command that takes the options only some strategies take (each strategy refuses the ones
    it does not): one flag per option the strategies' Options declare. They are read when the
    command is first parsed or shown, so that the commands without them (``query``, ``ask``,
    ``daemon``) start without importing the strategies. They follow the template options, else
    ``--strategy``."""

    swept = False  # eval's: each may be repeated (see swept_settings)

    def __init__(self, *args: Any, **kwargs: Any):
        self._strategy_options_added = False
        super().__init__(*args, **kwargs)

    @property
    def params(self) -> list[click.Parameter]:
        if not self._strategy_options_added:
            self._strategy_options_added = True
            after = ("strategy", "document_template", "query_template")
            at = max((i + 1 for i, param in enumerate(self._params) if param.name in after), default=0)
            self._params[at:at] = [self._option(spec) for spec in catalog.OPTION_SPECS]
        return self._params

    @params.setter
    def params(self, params: list[click.Parameter]) -> None:
        self._params = params

    def _option(self, spec: OptionSpec) -> click.Option:
        settings = click_settings(spec)
        settings = swept_settings(settings) if self.swept else {**settings, "default": None}
        return click.Option([spec.flag], **settings)


class SweptStrategyOptionsCommand(StrategyOptionsCommand):
    swept = True


def pop_sweeps(options: dict[str, Any]) -> dict[str, list[Any]]:
    """Pop ``eval``'s strategy options out of a command's keyword arguments as value lists."""
    names = [spec.name for spec in catalog.OPTION_SPECS] + ["document_template", "query_template"]
    given = {name: options.pop(name) for name in names}
    return {
        name: list(value) if isinstance(value, tuple) else [value] for name, value in given.items() if value
    }


def stored_search_breadth(command: Callable[..., Any]) -> Callable[..., Any]:
    """``build``'s --ef-search and --nprobe: the search options of that name, stored as the
    index's default for every search."""
    for spec in reversed([spec for spec in SEARCH_OPTION_SPECS if spec.name in ("ef_search", "nprobe")]):
        command = click.option(
            *spec.cli_flags,
            type=click.IntRange(spec.minimum, spec.maximum),
            default=None,
            help=f"{spec.help.removesuffix(' for this search.')}: the index's default for every search.",
        )(command)
    return command


def vector_index_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """How the vectors are indexed; given on a build of an existing index, they restructure its
    vectors without re-embedding."""
    options = [
        click.option(
            "--index-type",
            type=click.Choice(INDEX_TYPES),
            default=None,
            help=f"Vector index (default: the index's, else auto: exact up to {FLAT_SCAN_BYTES >> 20} MiB of "
            "vectors, e.g. 37k at 896-d, HNSW above).",
        ),
        click.option(
            "--hnsw-m",
            type=click.IntRange(min=2),
            default=None,
            help=f"HNSW: links per node ({VECTOR_INDEX.hnsw_m}).",
        ),
        click.option(
            "--ef-construction",
            type=click.IntRange(min=1),
            default=None,
            help=f"HNSW: build-time breadth ({VECTOR_INDEX.ef_construction}).",
        ),
        click.option(
            "--nlist", type=click.IntRange(min=0), default=None, help="IVF: lists (0: about sqrt(N))."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return stored_search_breadth(command)


def model_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--model", default=None, show_default=DEFAULT_MODEL_CHOSEN, help=MODEL_HELP + ".")(
        command
    )


def decoder_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--model", default=DEFAULT_DECODER, show_default=True, help=MODEL_HELP + " (a decoder)."
    )(command)


def build_command_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``build``, which ``watch`` takes too."""
    decorators: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--model", default=None, help=f"{MODEL_HELP} (default: the index's, else {DEFAULT_MODEL_CHOSEN})."
        ),
        click.option(
            "--strategy",
            default=None,
            help="Embedding strategy (see `ragidx strategies`); "
            "auto: the model's default at every document length (htp lost to it on long ones).",
        ),
        index_option,
        device_options,
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=None,
            help=f"Rows per forward pass (default: {CPU_ROWS} on a CPU; on a GPU, --max-batch-tokens / "
            f"{ROW_TOKENS}).",
        ),
        click.option(
            "--max-batch-tokens",
            type=click.IntRange(min=1),
            default=None,
            help=f"Padded tokens per forward pass (default: {CPU_TOKENS:,} on a CPU; on a GPU, what half its "
            f"free memory holds, up to {GPU_MAX_TOKENS:,}).",
        ),
        click.option(
            "--max-length",
            cls=LateHelpOption,
            type=click.IntRange(min=8),
            default=None,
            help_of=lambda: (
                f"Longest templated input in tokens ({strategy_defaults_shown('default_max_length')}; "
                "capped at the model's context)."
            ),
        ),
        click.option(
            "--chunk-tokens",
            cls=LateHelpOption,
            type=click.IntRange(min=8),
            default=None,
            help_of=lambda: f"Token budget of a chunk ({strategy_defaults_shown('default_chunk_tokens')}).",
        ),
        click.option(
            "--overlap-sentences",
            cls=LateHelpOption,
            type=click.IntRange(min=0),
            default=None,
            help_of=lambda: (
                f"Sentences repeated from the previous chunk (default {catalog.DEFAULT_OVERLAP_SENTENCES})."
            ),
        ),
        click.option(
            "--spacy-model",
            default=None,
            help="Installed spaCy pipeline for sentences (default: rule-based).",
        ),
        click.option(
            "--max-file-mb",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Skip files larger than this many MiB (default: the index's, else "
            f"{DEFAULT_MAX_FILE_BYTES >> 20}).",
        ),
        template_options,
        vector_index_options,
        click.option(
            "--rebuild",
            is_flag=True,
            help="Re-embed everything (needed to change model, strategy or settings).",
        ),
        trust_remote_code_option,
        click.option(
            "--dense/--no-dense",
            "dense",
            default=None,
            help="Keep vectors (--dense, which also adds them to a lexical index) or none (--no-dense: "
            "a lexical index, keyword search alone). Default: a new index embeds a sample first and "
            "keeps vectors where they beat keyword search on it; an index keeps its choice.",
        ),
        click.option(
            "--tune/--no-tune",
            default=True,
            show_default=True,
            help="Tune the hybrid weights on pseudo-queries from the corpus (new index, or >10% change).",
        ),
        click.option(
            "--ray",
            is_flag=False,
            flag_value="local",
            default=None,
            metavar="[ADDRESS]",
            help="Embed on Ray workers, each loading the model once: alone, a cluster on this machine; "
            "with ADDRESS (auto, ray://host:10001), that cluster (needs the ray extra).",
        ),
        click.option(
            "--ray-workers",
            type=click.IntRange(min=1),
            default=None,
            help="Ray workers (default: one per CPU of the cluster; --device cuda: one GPU each).",
        ),
        click.option(
            "--store",
            type=click.Choice(STORES),
            default=None,
            help="Where vectors live: local segment files (default) or a Milvus collection "
            "(needs the milvus extra; the index remembers it).",
        ),
        click.option(
            "--milvus-uri",
            default=None,
            metavar="URI",
            help="Milvus server (http://host:19530) or milvus-lite file (default: milvus.db in the index).",
        ),
        click.option(
            "--milvus-collection", default=None, metavar="NAME", help="Milvus collection (default: ragidx)."
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def search_flags(spec: SearchOptionSpec) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """A search option's CLI flags and their click settings, from its declaration. Filters are
    given as --path, --ext and --meta, each repeatable; weights as ``dense=W,lexical=W``."""
    if spec.kind == "filters":
        return [
            ((f"--{kind}", f"filter_{kind}"), {"multiple": True, "help": FILTER_HELP[kind]})
            for kind in FILTER_KINDS
        ]
    settings: dict[str, Any] = {"default": spec.default, "help": spec.help}
    if spec.kind == "bool":
        settings["is_flag"] = True
    elif spec.kind == "int":
        settings["type"] = click.IntRange(spec.minimum, spec.maximum)
    elif spec.kind == "float":
        settings["type"] = float
    elif spec.kind == "choice":
        settings["type"] = click.Choice(spec.choices)
    if spec.default is not None and spec.kind != "bool":
        settings["show_default"] = True
    if spec.metavar:
        settings["metavar"] = spec.metavar
    return [((*spec.cli_flags, spec.name), settings)]


def search_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One flag per search option (``ragidx.app.catalog.SEARCH_OPTION_SPECS``)."""
    for spec in reversed(SEARCH_OPTION_SPECS):
        for names, settings in reversed(search_flags(spec)):
            command = click.option(*names, **settings)(command)
    return command


def given_search_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the search options out of a command's keyword arguments, as ``Index.search`` takes them."""
    given = {spec.name: options.pop(spec.name) for spec in SEARCH_OPTION_SPECS if spec.name in options}
    given["filters"] = {
        "path": list(options.pop("filter_path")),
        "ext": list(options.pop("filter_ext")),
        "meta": parse_meta(options.pop("filter_meta")),
    }
    return given


def context_budget_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max-tokens``: the budget of a prompt's context (``query --context``, ``ask``)."""
    return click.option(
        "--max-tokens",
        type=click.IntRange(min=1),
        default=DEFAULT_CONTEXT_TOKENS,
        show_default=True,
        help=help,
    )


no_daemon_option = click.option(
    "--no-daemon",
    is_flag=True,
    help="Answer in this process, not through the per-user daemon that keeps the model loaded "
    "(env RAGIDX_NO_DAEMON=1 for every command).",
)


def comma_names(value: str | None) -> list[str | None]:
    return [name.strip() for name in value.split(",") if name.strip()] if value else [None]


def report_json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json",
        "json_target",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="[FILE]",
        help="Write the report as JSON to FILE, or alone: print it instead of the table.",
    )(command)


def plot_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--plot", type=click.Path(path_type=Path), default=None, help="Draw the rows to a PNG file."
    )(command)
