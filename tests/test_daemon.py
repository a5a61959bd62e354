"""The per-user daemon behind `ragidx query` and `ragidx embed`: the same answers as in-process,
new generations followed, a private socket, the switches that turn it off, and its end."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragidx.app import Index
from tests.support.cli import assert_one_line_error, ragidx
from tests.support.daemon import alive, sockets


def test_answers_are_the_same_with_and_without_the_daemon(daemon_env, small_index):
    search = ("query", "how long do refunds take", "--index", small_index, "--json", "--explain", "-k", "4")
    embed = ("embed", "tides and the moon", "a second text", "--index", small_index, "--json")
    with_daemon = [ragidx(*search, env=daemon_env).stdout, ragidx(*embed, env=daemon_env).stdout]
    assert len(sockets(daemon_env)) == 1
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert status["running"] and status["requests"] == 2  # the search and the embedding
    held = {
        "index": str(small_index.resolve()), "device": "auto", "dtype": None, "model_loaded": True,
        "answering": [],
    }  # fmt: skip
    assert status["indexes"] == [held]
    local = [ragidx(*search, "--no-daemon").stdout, ragidx(*embed, "--no-daemon").stdout]
    assert with_daemon == local and json.loads(local[0])[0]["explain"]
    human = ragidx("query", "refunds", "--index", small_index, "-k", "2", env=daemon_env).stdout
    assert human == ragidx("query", "refunds", "--index", small_index, "-k", "2", "--no-daemon").stdout
    bad = ragidx(
        "query", "refunds", "--index", small_index, "--weights", "dense=x", env=daemon_env, check=False
    )
    assert_one_line_error(bad, "weight of dense is not a number")


def test_the_daemon_follows_new_generations(daemon_env, small_index, sample_corpus, tiny_models):
    query = ("query", "lighthouse lens keepers", "--index", small_index, "--json", "--mode", "lexical")
    assert json.loads(ragidx(*query, env=daemon_env).stdout) == []  # no article indexed yet
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus / "articles"], small_index, **options)
    found = json.loads(ragidx(*query, env=daemon_env).stdout)
    assert found and all("/articles/" in hit["path"] for hit in found)


def test_the_socket_is_private_and_the_switches_keep_it_off(daemon_env, small_index, tmp_path):
    ragidx("query", "tides", "--index", small_index, env=daemon_env)
    (socket,) = sockets(daemon_env)
    assert stat.S_IMODE(socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700
    shared = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp"))
    shared.chmod(0o755)
    (shared / "ragidx").mkdir(mode=0o755)  # others may enter: no daemon there, the query still answers
    opened = {**daemon_env, "XDG_RUNTIME_DIR": str(shared)}
    assert ragidx("query", "tides", "--index", small_index, env=opened).stdout
    assert not list((shared / "ragidx").iterdir())
    off_folder = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp"))
    off = {**daemon_env, "RAGIDX_NO_DAEMON": "1", "XDG_RUNTIME_DIR": str(off_folder)}
    ragidx("query", "tides", "--index", small_index, env=off)
    ragidx("query", "tides", "--index", small_index, "--no-daemon", env={**off, "RAGIDX_NO_DAEMON": "0"})
    assert not (tmp_path / "off" / "ragidx").exists() or not list(
        (tmp_path / "off" / "ragidx").glob("*.sock")
    )


def test_python_m_ragidx_and_the_ragidx_script_share_one_daemon(daemon_env, small_index):
    """The script's shebang names one interpreter (python3), `python -m ragidx` often another name
    of the same (python, python3.11): one daemon answers them all."""
    ragidx("query", "tides", "--index", small_index, env=daemon_env)
    names = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")
    pythons = [path for name in names if (path := Path(sys.executable).with_name(name)).exists()]
    assert len(pythons) > 1
    for python in pythons:
        query = [python, "-m", "ragidx", "query", "tides", "--index", small_index]
        subprocess.run(query, env=daemon_env, check=True, capture_output=True, timeout=120)
    assert len(sockets(daemon_env)) == 1


def test_the_daemon_stops_when_idle_or_told(daemon_env, small_index):
    ragidx("query", "tides", "--index", small_index, env={**daemon_env, "RAGIDX_DAEMON_IDLE": "2"})
    pid = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)["pid"]
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid) and sockets(daemon_env) == []
    assert ragidx("daemon", "status", env=daemon_env).stdout.strip() == "no daemon is running"
    ragidx("query", "tides", "--index", small_index, env=daemon_env)
    stopped = ragidx("daemon", "stop", env=daemon_env).stdout
    assert stopped.startswith("stopped daemon ") and sockets(daemon_env) == []
