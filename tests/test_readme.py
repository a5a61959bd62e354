"""The Python examples of the README and the Python API page, run as written with the default model
(MiniLM: a random model's vectors are tuned away on the sample corpus, leaving keyword search), and
what the README tells users to run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import child_env
from tests.support.real_models import installed

README = Path(__file__).resolve().parent.parent / "README.md"
PYTHON_API = README.with_name("docs") / "python-api.md"


def first_python_example(page: Path) -> str:
    return re.search(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL).group(1)


def run_example(page: Path, folder: Path, corpus: Path) -> list[str]:
    """The page's first Python example's output, run in ``folder`` beside a copy of ``corpus``,
    with the default model (the test is skipped where it is not installed)."""
    installed("minilm")
    shutil.copytree(corpus, folder / "sample_corpus")
    environment = {name: value for name, value in child_env().items() if name != "RAGIDX_MODEL"}
    result = subprocess.run(
        [sys.executable, "-c", first_python_example(page)],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_readme_python_example_runs_as_written(tmp_path, sample_corpus):
    lines = run_example(README, tmp_path, sample_corpus)
    assert [line.split(" ", 1)[0] for line in lines] == ["1", "2", "3"]
    assert all(Path(line.split(" ")[2]).is_file() for line in lines)  # paths of indexed files


def test_the_python_api_example_runs_as_documented(tmp_path, sample_corpus):
    lines = run_example(PYTHON_API, tmp_path, sample_corpus)
    assert lines[-1] == "(1, 384)"  # MiniLM's vector of one query
    hits = [line.split(" ", 3) for line in lines[:-1]]
    assert [rank for rank, *_ in hits] == ["1", "2"]  # only two chunks have category "account"
    assert sorted(Path(path).name for _, _, path, _ in hits) == [
        "delete-account.markdown",
        "password-reset.html",
    ]
    assert (tmp_path / "my-index" / "ragidx.db").is_file()


def test_the_install_commands_never_pull_cuda_wheels_on_a_cpu_machine():
    install = README.read_text(encoding="utf-8").split("## Install", 1)[1].split("\n## ", 1)[0]
    torch_lines = [line for line in install.splitlines() if line.startswith("pip install torch")]
    assert torch_lines and all("download.pytorch.org/whl/cpu" in line for line in torch_lines)


def test_lint_does_not_depend_on_the_checkout_folder_name(tmp_path):
    """ruff decides first-party imports by folder name unless told: a checkout named `ragidx`
    sorted imports differently from one named anything else."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    root = README.parent
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if ruff is None or listed.returncode != 0:
        pytest.skip("needs ruff and a git checkout")
    for name in ("ragidx", "checkout"):
        for relative in listed.stdout.split():
            if relative.endswith((".py", ".toml")) and Path(root, relative).is_file():
                target = tmp_path / name / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / relative, target)
        result = subprocess.run(
            [ruff, "check", "--no-cache", "."], cwd=tmp_path / name, capture_output=True, text=True
        )
        assert result.returncode == 0, f"{name}: {result.stdout}"
