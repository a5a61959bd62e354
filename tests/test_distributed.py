"""``ragidx build --ray``: embedding on Ray Data workers gives the index a local build gives, and
a cluster that cannot be reached changes nothing. Each build runs the CLI in its own process,
which starts (and stops) a two-worker cluster on this machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx
from tests.support.index_files import stored_vectors
from tests.support.lifecycle import build

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

RAY = ("--ray", "--ray-workers", "2", "--strategy", "htp", "--no-tune")
STARTS = "import ray; ray.init(num_cpus=2, include_dashboard=False); ray.shutdown()"


@pytest.fixture(scope="module", autouse=True)
def ray_starts_here() -> None:
    """Skip (saying why) where this machine cannot start a local Ray cluster at all."""
    started = subprocess.run([sys.executable, "-c", STARTS], capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        pytest.skip(f"a local Ray cluster does not start here: {started.stderr.strip().splitlines()[-1:]}")


@pytest.fixture(scope="module")
def local(tmp_path_factory, tiny_models, sample_corpus) -> Path:
    """The sample corpus indexed in this process, the reference for the Ray builds."""
    index = tmp_path_factory.mktemp("local") / "index"
    build(sample_corpus, index, tiny_models["llama"], "--strategy", "htp", "--no-tune")
    return index


def assert_same_index(ray_index: Path, local_index: Path) -> None:
    """Same chunks under the same ids, and each vector within cosine 0.9999 of the local one."""
    ours, theirs = stored_vectors(ray_index), stored_vectors(local_index)
    assert ours.keys() == theirs.keys()
    for key, (chunk_id, vector) in ours.items():
        assert chunk_id == theirs[key][0]
        assert float(np.dot(vector, theirs[key][1])) >= 0.9999, key


def test_a_ray_build_equals_a_local_build_vector_for_vector(local, tiny_models, sample_corpus, tmp_path):
    summary = build(sample_corpus, tmp_path / "index", tiny_models["llama"], *RAY)
    assert summary["documents"] == 13 and summary["strategy"] == "htp"
    assert_same_index(tmp_path / "index", local)
    hits = ragidx("query", "how do I reset my password", "--index", tmp_path / "index", "--json").stdout
    assert "password-reset" in hits


def test_an_unreachable_cluster_is_one_line_and_changes_nothing(local, tiny_models, sample_corpus, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(local, index)
    before = stored_vectors(index)
    args = ("build", sample_corpus, "--model", tiny_models["llama"], "--index", index, "--rebuild")
    failed = ragidx(*args, "--ray", "127.0.0.1:1", check=False)
    assert_one_line_error(failed, r"cannot reach the Ray cluster at 127\.0\.0\.1:1")
    workers_alone = ragidx(*args, "--ray-workers", "2", check=False)
    assert_one_line_error(workers_alone, r"--ray-workers needs --ray")
    after = stored_vectors(index)
    assert after.keys() == before.keys()
    assert all(np.array_equal(after[key][1], before[key][1]) for key in before)


def kill_first_worker(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first Ray Data worker process that appears (once)."""
    while not stop.is_set() and not killed:
        for process in psutil.process_iter(["cmdline"]):
            if any("MapWorker" in part for part in process.info["cmdline"] or []):
                process.kill()
                killed.append(process.pid)
                return
        time.sleep(0.05)


def test_a_worker_killed_mid_build_is_replaced_and_the_index_is_whole(
    local, tiny_models, sample_corpus, tmp_path
):
    """Ray restarts a killed worker and redoes its batch: the build still equals a local one."""
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=kill_first_worker, args=(stop, killed))
    killer.start()
    try:
        args = ("build", sample_corpus, "--model", tiny_models["llama"], "--index", tmp_path / "index", *RAY)
        result = subprocess.run(
            [RAGIDX, *map(str, args)], capture_output=True, text=True, env=child_env(), timeout=300
        )
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker appeared"
    assert result.returncode == 0, result.stderr
    assert_same_index(tmp_path / "index", local)
