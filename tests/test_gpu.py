"""CUDA paths: the model on the GPU, and exact search with faiss on the GPU. Skipped without one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.local.faiss_index import new_vector_index
from ragidx.indexer.storage.vector_store import VectorQuery

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "sample_corpus"


def faiss_gpus() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


@pytest.mark.skipif(
    faiss_gpus() < 1, reason="faiss without CUDA or no GPU (faiss-gpu-cu12 for faiss-cpu, docs/gpu.md)"
)
def test_exact_search_on_the_gpu_equals_the_cpu():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(7, 5007, dtype=np.int64)
    cpu = new_vector_index(VectorIndexSettings(requested="flat"), vectors, ids)
    queries = vectors[:50]
    expected_scores, expected_ids = cpu.search(VectorQuery(queries, 10))
    assert cpu.use_gpu()
    scores, found = cpu.search(VectorQuery(queries, 10))
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-4)
    allowed = ids[::7]  # filtered searches stay on the CPU index and stay exact
    np.testing.assert_array_equal(cpu.search(VectorQuery(queries, 5, allowed=allowed))[1][:, 0] % 7, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_the_model_on_cuda_gives_the_cpu_vectors(tiny_models):
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    texts = ["The lighthouse keeper trimmed the wick.", "Compost needs air and water."]
    vectors = {
        device: create_strategy("mean", load_runtime(str(tiny_models["qwen2"]), device, "float32")).encode(
            texts
        )
        for device in ("cpu", "cuda")
    }
    np.testing.assert_allclose(vectors["cuda"], vectors["cpu"], atol=1e-4)


def decoder_strategies() -> list[str]:
    from ragidx.indexer.strategies import REGISTRY

    return sorted(name for name, cls in REGISTRY.items() if cls.decoder_only)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_every_strategy_on_cuda_gives_the_cpu_vectors(tiny_models, arch):
    """float32 on the GPU equals float32 on the CPU for every decoder strategy (placeholders, hooks,
    early exit, value aggregation and re-routing included), single texts too."""
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    texts = [
        "The lighthouse keeper trimmed the wick. Gulls circled the rocks below.",
        "Compost needs air and water.",
        "Tides rise twice a day. The moon pulls the sea. Sailors read the tables before leaving port.",
    ]
    runtimes = {device: load_runtime(str(tiny_models[arch]), device, "float32") for device in ("cpu", "cuda")}
    for name in decoder_strategies():
        got = {device: create_strategy(name, runtime) for device, runtime in runtimes.items()}
        vectors = {device: strategy.encode(texts) for device, strategy in got.items()}
        np.testing.assert_allclose(vectors["cuda"], vectors["cpu"], atol=2e-4, err_msg=name)
        for _ in range(3):  # one-row readouts, past the call that records a trace on a CPU
            single = {device: strategy.encode(texts[1:2], "query") for device, strategy in got.items()}
            np.testing.assert_allclose(single["cuda"], single["cpu"], atol=2e-4, err_msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_int8_weights_on_cuda_give_the_cpu_int8_vectors(tiny_models, arch):
    """``--dtype int8`` on a GPU (what ``auto`` falls back to where bf16 does not fit the card):
    the weights are rounded on the CPU at load and moved, so every strategy's vectors equal the
    CPU's int8 vectors, batched and single."""
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    texts = ["Keep the compost heap damp and airy. Turn it weekly.", "Tides", "Gulls circled the rocks."]
    runtimes = {device: load_runtime(str(tiny_models[arch]), device, "int8") for device in ("cpu", "cuda")}
    held = [buffer for name, buffer in runtimes["cuda"].model.named_buffers() if name.endswith("int8_weight")]
    assert held and all(each.is_cuda and each.dtype == torch.int8 for each in held)
    for name in decoder_strategies():
        got = {device: create_strategy(name, runtime) for device, runtime in runtimes.items()}
        vectors = {device: strategy.encode(texts) for device, strategy in got.items()}
        np.testing.assert_allclose(vectors["cuda"], vectors["cpu"], atol=2e-4, err_msg=name)
        single = {device: strategy.encode(texts[:1], "query") for device, strategy in got.items()}
        np.testing.assert_allclose(single["cuda"], single["cpu"], atol=2e-4, err_msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_a_gpu_batch_is_what_its_free_memory_holds(tiny_models):
    from ragidx.indexer.model.batch_size import activation_bytes_per_token, gpu_batch
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import BatchSettings, create_strategy

    runtime = load_runtime(str(tiny_models["llama"]), "cuda", "bfloat16")
    chosen = create_strategy("mean", runtime).batch
    free = torch.cuda.mem_get_info()[0]
    expected = gpu_batch(free, activation_bytes_per_token(runtime.model.config, 2))
    assert chosen == expected and chosen.max_tokens > BatchSettings().max_tokens
    texts = [f"Text number {i} about tides, rocks and gulls." for i in range(100)]
    small = create_strategy("mean", runtime, batch=BatchSettings()).encode(texts)
    np.testing.assert_allclose(create_strategy("mean", runtime).encode(texts), small, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_bench_on_cuda_counts_gpu_memory_and_probes_a_large_product(tiny_models):
    from ragidx.app.research.bench import run_bench
    from ragidx.app.research.calibrate import SAMPLE_CORPUS

    report = run_bench(str(tiny_models["llama"]), ["mean"], ["bfloat16"], "cuda", SAMPLE_CORPUS, 64, 40, 5)
    (row,) = report.rows
    assert report.probe_size == 8192 and report.matmul_peaks["bfloat16"] > 50e12  # any datacenter GPU
    assert row.peak_device_mib > 0 and 0 < row.padding < 1 and row.batch_tokens >= 16384


@pytest.mark.real
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m", "minilm"])
def test_real_models_in_bfloat16_on_cuda_give_the_cpu_float32_vectors(model):
    """Every strategy the model takes, on the first chunk of each sample document and the probes:
    ``--dtype auto`` on a GPU (bf16) against float32 on the CPU, held to the CPU's bf16 floors."""
    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.sources import SourceDocument, read_document, scan
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy
    from tests.support.real_models import AMPLIFIED_MIN_COSINE, MIN_COSINE, PROBES, installed
    from tests.support.real_models import decoder_strategies as real_strategies

    cpu = load_runtime(installed(model), "cpu", "float32")
    gpu = load_runtime(model, "cuda", "auto")
    assert gpu.precision == "bfloat16"
    chunker = Chunker(cpu.tokenizer, 256, 0, None)
    found = scan([SAMPLE_CORPUS], keep_text=False).documents
    documents = [read_document(Path(each.path)) for each in found]
    texts = [chunker.chunk(doc.text)[0].text for doc in documents if isinstance(doc, SourceDocument)]
    for name in real_strategies() if cpu.arch.is_decoder else ["mean"]:
        exact = create_strategy(name, cpu).encode([*texts, *PROBES])
        got = create_strategy(name, gpu).encode([*texts, *PROBES])
        cosines = np.sum(got * exact, axis=1)
        print(f"{model} {name}: cuda bfloat16 to cpu float32 cosine min {cosines.min():.5f}")
        # on a GPU's bf16 kernels: tp, one SmolLM2 chunk at 0.9981 (H200); cp, one Gemma 3 chunk at
        # 0.99456 (H100; the CPU's bf16: 0.99760 at least on the same texts), its probes' hits unchanged
        floors = {**AMPLIFIED_MIN_COSINE, "tp": 0.995, "cp": 0.994}
        assert cosines.min() >= floors.get(name, MIN_COSINE), (name, cosines.min())
