"""The README's Python API example, run as written against a tiny model."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from test_cli import child_env

README = Path(__file__).resolve().parent.parent / "README.md"


def python_api_example() -> str:
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_python_api_example_runs_as_documented(tmp_path, tiny_models, sample_corpus):
    shutil.copytree(sample_corpus, tmp_path / "sample_corpus")
    result = subprocess.run(
        [sys.executable, "-c", python_api_example()],
        cwd=tmp_path,
        env={**child_env(), "RAGIDX_MODEL": str(tiny_models["qwen2"])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "(1, 64)"
    hits = [line.split(" ", 3) for line in lines[:-1]]
    assert [rank for rank, *_ in hits] == ["1", "2"]  # only two chunks have category "account"
    assert sorted(Path(path).name for _, _, path, _ in hits) == [
        "delete-account.markdown",
        "password-reset.html",
    ]
    assert (tmp_path / "my-index" / "ragidx.db").is_file()
