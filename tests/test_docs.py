"""The documentation checked against the code: every command line shown names real commands and
flags, the README stays short and no page grows past reading length, every page is in the site.
(`python -m mkdocs build --strict`, run by .ci/run, checks links and the generated reference.)"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ragidx.cli import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250
MAX_PAGE_LINES = 600
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`(ragidx [^`]+)`")
FLAG = re.compile(r"^--?[A-Za-z][\w-]*")
SHELL_OPERATORS = {"&&", "||", ";", "|", ">", "<", "&"}


def command_lines(text: str) -> Iterator[list[str]]:
    r"""The words of each ``ragidx ...`` invocation in the text: in code blocks, as the shell splits
    a line into commands (``&&``, ``;``, pipes) and words; in inline code, usage text whose
    brackets are dropped and whose ``\|`` separates alternatives."""
    for block in FENCE.findall(text):
        for line in block.splitlines():
            lexer = shlex.shlex(line.removeprefix("$ "), posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError:  # not shell (an unbalanced quote in printed output)
                continue
            command: list[str] = []
            for token in [*tokens, ";"]:
                if token in SHELL_OPERATORS:
                    if command[:1] == ["ragidx"]:
                        yield command
                    command = []
                else:
                    command.append(token)
    for usage in INLINE.findall(FENCE.sub("", text)):
        usage = usage.replace("\\|", "|")
        yield [part for part in re.split(r"[\s\[\]]+", usage) if part not in ("", "...", "…")]


def check_line(line: list[str]) -> list[str]:
    """What in the command line's words is not a ragidx command or flag (empty when all is)."""
    command: click.Command = cli
    path = ["ragidx"]
    problems = []
    for word in (word.strip("[]") for word in line[1:]):
        flag = FLAG.match(word)
        if flag:
            known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
            if flag.group(0) not in known | {"--help", "-h"}:
                problems.append(f"{' '.join(path)} has no option {flag.group(0)}")
        elif isinstance(command, click.Group) and re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", word):
            names = word.split("|")
            found = [command.commands.get(name) for name in names]
            if all(found):
                command, path = found[0], [*path, names[0]]  # type: ignore[assignment]
                continue
            if not command.invoke_without_command:
                problems.append(f"{' '.join(path)} has no command {word}")
            break
        elif isinstance(command, click.Group) and not word.isupper():
            problems.append(f"{' '.join(path)} needs a command, not {word}")
            break
    return problems


def documented() -> list[tuple[str, list[str]]]:
    return [
        (page.relative_to(ROOT).as_posix(), line)
        for page in [ROOT / "README.md", *PAGES]
        for line in command_lines(page.read_text(encoding="utf-8"))
    ]


def test_every_command_line_shown_names_real_commands_and_flags():
    lines = documented()
    assert len(lines) > 100  # the pages do show commands: the extraction works
    wrong = {f"{page}: {' '.join(line)}": check_line(line) for page, line in lines if check_line(line)}
    assert not wrong


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("ragidx query TEXT --nonsense", "ragidx query has no option --nonsense"),
        ("ragidx querry TEXT", "ragidx has no command querry"),
        ("ragidx daemon status|restart", "ragidx daemon has no command status|restart"),
        ("ragidx eval retrieval DIR [--max-docs N] [--fast]", "ragidx eval retrieval has no option --fast"),
    ],
)
def test_the_checker_finds_a_wrong_command_or_flag(line, problem):
    inline = f"`{line.replace('|', chr(92) + '|')}`"  # as a table cell writes alternatives
    fenced = f"```\n$ cat q.txt | {line.replace('|', ' ')} && ls\n```\n"
    assert [check_line(words) for words in command_lines(inline)] == [[problem]]
    if "|" not in line:  # in a code block, | is a pipe
        assert [check_line(words) for words in command_lines(fenced)] == [[problem]]


def test_the_readme_is_short_and_no_page_is_too_long():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES
    long = {
        page.name: n
        for page in PAGES
        if (n := len(page.read_text(encoding="utf-8").splitlines())) > MAX_PAGE_LINES
    }
    assert not long


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.MULTILINE))
    assert listed == {page.name for page in PAGES}


def test_every_documentation_link_in_the_readme_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert targets and [target for target in targets if not (ROOT / target).is_file()] == []


def test_every_strategy_option_and_packaged_model_is_documented():
    """The lists the code makes are on their pages: each strategy (with its options) where the
    strategies are described, each packaged model where the models are."""
    from ragidx.app.catalog import packaged_model_rows, strategy_rows

    strategies = (ROOT / "docs" / "strategies.md").read_text(encoding="utf-8")
    models = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    missing = [row["name"] for row in strategy_rows() if f"`{row['name']}`" not in strategies]
    missing += [
        f"--{option.replace('_', '-')}"
        for row in strategy_rows()
        for option in row["options"]
        if f"--{option.replace('_', '-')}" not in strategies
    ]
    missing += [row["name"] for row in packaged_model_rows() if f"`{row['name']}`" not in models]
    assert missing == []


def test_the_site_builds_with_the_mkdocs_command_itself(tmp_path):
    """`mkdocs build` as users type it (the console script, whose folder also holds `ragidx`'s), not
    only `python -m mkdocs`: the API pages once failed there (docs/mkdocs_hooks.py says why)."""
    import os
    import subprocess
    import sys

    script = Path(sys.executable).parent / "mkdocs"
    if not script.is_file():
        pytest.skip("the docs extra is not installed: pip install -e '.[docs]'")
    built = subprocess.run(
        [str(script), "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert (tmp_path / "site" / "python-api" / "index.html").is_file()
