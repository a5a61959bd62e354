"""A corpus of what a developer has at hand: the long descriptions (READMEs) of installed Python
packages, one file each, and eight questions a developer would ask of it, written before searching.

Usage:
  python -m tests.benchmarks.readme_corpus write OUT --set core|held-out|fresh [--site DIR]
  python -m tests.benchmarks.readme_corpus check CORPUS [--index DIR] [--questions core|held-out|fresh]
      [-- BUILD ARGS...]
  python -m tests.benchmarks.readme_corpus resume CORPUS [--files 20] [--model M] [-- BUILD ARGS...]

``write`` reads the distributions installed beside the Python that runs it: ``core`` is what
``pip install ragidx`` brings (its requirements, followed through theirs: the corpus a new user
of a fresh venv has), ``held-out`` every other installed package (the dev, docs and test extras'),
so questions about it were never seen while tuning the build on the core set. ``fresh`` reads
another venv's site-packages (``--site``) and keeps what is not installed here: an application
developer's packages, made with ``python -m venv /tmp/fresh && /tmp/fresh/bin/pip install
FRESH_PACKAGES`` (the names below), for the ``fresh`` questions.

``check`` times ``ragidx build CORPUS`` (a fresh index, the defaults unless BUILD ARGS say
otherwise), then asks the eight held-out questions (``--questions core``: the sixteen development
questions of the core set; ``fresh``: the fresh set's eight) in hybrid mode (the default: the right package
at rank 1?) and, where the index keeps vectors, in dense mode (in the top 3?).

``resume`` builds ``--files`` files of the corpus whole, then again in a fresh index stopped by
SIGINT once its progress line shows half the bytes embedded, then runs that build again: the
share of the whole build's tokens the resumed build embedded (``embedded_tokens`` of
``build --json``) is what an interruption cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

# Held-out questions (package names as pip spells them, normalised); written from what each
# package is for, before any search of the corpus. Each answer is the package a developer asking
# it would want; a tuple accepts any of its packages.
QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("how do I serve an ASGI web application with a fast production server?", ("uvicorn",)),
    ("serialize dataclasses and numpy arrays to JSON quickly", ("orjson",)),
    ("count the tokens of a text for OpenAI models", ("tiktoken",)),
    ("automate a real web browser to test my site end to end", ("selenium",)),
    ("a very fast Python linter and formatter written in Rust", ("ruff",)),
    ("structured concurrency for async I/O with nurseries", ("trio",)),
    ("encode and verify JSON Web Tokens", ("pyjwt",)),
    ("map Python classes to database tables with an ORM and SQL expressions", ("sqlalchemy",)),
]
# A second held-out set (``--set fresh``: an application developer's venv, written 2026-11-27 with
# these eight questions before that corpus was built or searched), judged once per change.
FRESH_QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("run background jobs on a distributed task queue with workers and a message broker", ("celery",)),
    ("generate fake names, addresses and emails for test data", ("faker",)),
    ("property-based testing that generates examples to find edge cases", ("hypothesis",)),
    ("connect to a remote server over SSH and run commands", ("paramiko", "fabric")),
    ("freeze the current time in tests so that datetime.now returns a fixed date", ("freezegun",)),
    ("fuzzy string matching with Levenshtein distance", ("rapidfuzz", "thefuzz")),
    ("an in-process analytical SQL database to query Parquet and CSV files", ("duckdb",)),
    ("database schema migrations for SQLAlchemy", ("alembic",)),
]
# What the fresh venv's pip installs (their dependencies come along).
FRESH_PACKAGES = (
    "flask django celery redis boto3 scikit-learn polars duckdb loguru structlog paramiko fabric "
    "black isort pylint hypothesis faker freezegun responses pytest-cov tox pre-commit gunicorn "
    "psycopg2-binary pymongo alembic msgpack cattrs more-itertools toolz diskcache apscheduler arrow "
    "pendulum humanize bcrypt passlib itsdangerous jmespath xmltodict toml tomlkit python-slugify "
    "unidecode emoji colorlog prettytable openpyxl xlsxwriter seaborn bokeh altair scipy sentry-sdk "
    "prometheus-client docker schedule rq docopt fire cookiecutter mako mistune bleach html5lib "
    "feedparser ftfy rapidfuzz thefuzz jellyfish pydantic-settings authlib oauthlib bandit "
    "pyinstrument memory-profiler"
)
# Development questions for the core set (what `pip install ragidx` brings), written before any
# search of it: the set to try a change on before the held-out questions judge it.
CORE_QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("parse HTML documents and pull data out of their tags", ("beautifulsoup4",)),
    ("show a progress bar for a loop in the terminal", ("tqdm",)),
    ("simplify algebraic expressions and solve equations symbolically", ("sympy",)),
    ("print a list of rows as a nicely formatted table", ("tabulate",)),
    ("efficient similarity search over dense vectors", ("faiss-cpu",)),
    ("read CPU, memory and disk usage and list running processes", ("psutil",)),
    ("create graphs and compute shortest paths between nodes", ("networkx",)),
    ("store tensors in a file that is safe and fast to load", ("safetensors",)),
    # harder: no package name in the question (the eight above were all answered first by MiniLM)
    ("detect the character encoding of bytes of unknown origin", ("charset-normalizer",)),
    ("make HTTP requests from async code with HTTP/2 support", ("httpx", "httpx2")),
    ("build a command line interface from a function's type hints", ("typer",)),
    ("render colourful formatted text, tables and markdown in the terminal", ("rich",)),
    ("where to keep a user's data and config folders on every operating system", ("platformdirs",)),
    ("lock a file so that only one process uses it at a time", ("filelock",)),
    ("parse dates in many formats and compute relative deltas between them", ("python-dateutil",)),
    ("validate data against Python type annotations", ("pydantic",)),
]
QUESTION_SETS = {"held-out": QUESTIONS, "core": CORE_QUESTIONS, "fresh": FRESH_QUESTIONS}
SUFFIXES = {"text/markdown": ".md", "text/x-rst": ".rst"}
REPOSITORY = Path(__file__).resolve().parents[2]
RAGIDX = [str(Path(sys.executable).with_name("ragidx"))]  # the console script beside this Python


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(site: Path | None = None) -> dict[str, metadata.Distribution]:
    """The distributions beside this Python, or in the site-packages folder ``site``."""
    found: dict[str, metadata.Distribution] = {}
    for distribution in metadata.distributions(**({"path": [str(site)]} if site else {})):
        found.setdefault(normalised(distribution.metadata["Name"]), distribution)
    return found


def core(distributions: dict[str, metadata.Distribution]) -> set[str]:
    """ragidx's requirements without extras, followed through theirs, as installed here."""
    wanted, seen = ["ragidx"], set()
    while wanted:
        name = wanted.pop()
        if name in seen or name not in distributions:
            continue
        seen.add(name)
        for line in distributions[name].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(normalised(requirement.name))
    return seen - {"ragidx"}


def write(out: Path, which: str, site: Path | None) -> None:
    here = installed()
    if which == "fresh":
        if site is None:
            raise SystemExit("--set fresh reads another venv's site-packages: give --site DIR")
        distributions = installed(site)
        names = sorted(set(distributions) - set(here))
    else:
        distributions = here
        base = core(distributions)
        names = sorted(base if which == "core" else set(distributions) - base - {"ragidx"})
    out.mkdir(parents=True, exist_ok=True)
    written = size = 0
    for name in names:
        message = distributions[name].metadata
        body = message.get_payload() or message.get("Description") or ""
        if len(body.strip()) < 200:  # a line or two says nothing to search for
            continue
        kind = (message.get("Description-Content-Type") or "").split(";")[0].strip()
        path = out / f"{name}{SUFFIXES.get(kind, '.txt')}"
        path.write_text(body, encoding="utf-8")
        written += 1
        size += len(body.encode())
    print(f"{written} packages, {size / 1024:.0f} kB -> {out}")


def ragidx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RAGIDX, *args], capture_output=True, text=True, env=env, cwd=REPOSITORY)


def built(corpus: Path, index: Path, extra: list[str]) -> tuple[dict, float]:
    started = time.perf_counter()
    result = ragidx("build", str(corpus), "--index", str(index), "--rebuild", "--json", *extra)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"build failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout), seconds


def packages(hits: list[dict]) -> list[str]:
    return [normalised(Path(hit["path"]).stem) for hit in hits]


def check(corpus: Path, index: Path, extra: list[str], questions: list[tuple[str, tuple[str, ...]]]) -> None:
    report, seconds = built(corpus, index, extra)
    print(f"build: {seconds:.1f} s wall, {report['chunks']} chunks, {report['tokens']} tokens")
    print(
        f"model {report['model']} ({report['dtype']}), strategy {report['strategy']}, dense {report['dense']}"
    )
    print(
        f"embedded {report['embedded_tokens']} tokens in {report['embed_seconds']:.1f} s "
        f"({report['tokens_per_second']:.0f} tokens/s); build {report['seconds']:.1f} s"
    )
    sample = report["sample"]
    if sample:
        print(
            f"sample: {sample['documents']} documents, {sample['chunks']} chunks, {sample['tokens']} tokens, "
            f"embedded in {sample['embed_seconds']:.1f} s ({sample['tokens_per_second']:.0f} tokens/s), "
            f"tuned in {sample['tuning']['seconds']:.1f} s; keep vectors {sample['keep_vectors']}; "
            f"rest estimated {sample['rest_tokens_estimate']} tokens, {sample['rest_seconds_estimate']} s"
        )
        print(f"sample nDCG@10: {sample['tuning']['ndcg@10']}")
    fusion = report["fusion"] or {}
    print(f"fusion: {fusion.get('method')} {fusion.get('weights')}, tuned in {fusion.get('seconds')} s")
    print(f"fusion nDCG@10: {fusion.get('ndcg@10')}")
    modes = ["hybrid"] + (["dense"] if report["dense"] else [])
    scores = {mode: 0 for mode in modes}
    for question, answers in questions:
        row = []
        for mode in modes:
            result = ragidx("query", question, "--index", str(index), "--mode", mode, "-k", "3", "--json")
            if result.returncode != 0:
                raise SystemExit(f"query failed: {result.stderr[-800:]}")
            found = packages(json.loads(result.stdout))
            hit = (
                bool(found) and found[0] in answers if mode == "hybrid" else any(f in answers for f in found)
            )
            scores[mode] += hit
            row.append(f"{mode} {'+' if hit else '-'} {','.join(found)}")
        print(f"{question[:60]:<60}  {' | '.join(row)}")
    print(
        f"hybrid rank 1: {scores['hybrid']}/{len(questions)}"
        + (f"; dense top 3: {scores['dense']}/{len(questions)}" if "dense" in scores else "")
    )


def resume(corpus: Path, files: int, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="ragidx-resume-") as folder:
        part = Path(folder) / "corpus"
        part.mkdir()
        for path in sorted(corpus.iterdir())[:files]:
            shutil.copy(path, part / path.name)
        flags = ["--dense", "--no-tune", *extra]
        whole, _ = built(part, Path(folder) / "whole", flags)
        print(f"whole build: {whole['embedded_tokens']} tokens embedded in {whole['embed_seconds']:.1f} s")
        index = Path(folder) / "interrupted"
        command = [*RAGIDX, "build", str(part), "--index", str(index)]
        child = subprocess.Popen(
            [*command, *flags],
            cwd=REPOSITORY,
            env={**os.environ, "RAGIDX_PROGRESS_SECONDS": "1"},
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as at a terminal: a background job (nohup, &) starts with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert child.stderr is not None
        for line in child.stderr:  # "embedding: 75 kB of 137 kB (55%), ..." once a second
            done = re.match(r"embedding: .*\((\d+)%\)", line)
            if done and int(done.group(1)) >= 50:
                child.send_signal(signal.SIGINT)
                print(f"stopped at {line.strip()}")
                break
        child.communicate()
        print(f"interrupted: exit {child.wait()}")
        again, _ = built(part, index, flags)
        share = again["embedded_tokens"] / max(whole["embedded_tokens"], 1)
        print(f"resumed: {again['resumed']}")
        print(f"embedded {again['embedded_tokens']} tokens, {share:.0%} of the whole build's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write")
    writing.add_argument("out", type=Path)
    writing.add_argument("--set", choices=("core", "held-out", "fresh"), default="held-out")
    writing.add_argument("--site", type=Path, default=None)
    checking = commands.add_parser("check")
    checking.add_argument("corpus", type=Path)
    checking.add_argument("--index", type=Path, default=None)
    checking.add_argument("--questions", choices=tuple(QUESTION_SETS), default="held-out")
    resuming = commands.add_parser("resume")
    resuming.add_argument("corpus", type=Path)
    resuming.add_argument("--files", type=int, default=20)
    arguments, extra = parser.parse_known_args()
    extra = [value for value in extra if value != "--"]
    if arguments.command == "write":
        write(arguments.out, arguments.set, arguments.site)
    elif arguments.command == "check":
        index = arguments.index or Path(tempfile.mkdtemp(prefix="ragidx-readmes-")) / "index"
        check(arguments.corpus, index, extra, QUESTION_SETS[arguments.questions])
    else:
        resume(arguments.corpus, arguments.files, extra)


if __name__ == "__main__":
    main()
