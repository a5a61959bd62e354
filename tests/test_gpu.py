"""CUDA paths: the model on the GPU, and exact search with faiss on the GPU. Skipped without one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.vector_index import new_vector_index


def faiss_gpus() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


@pytest.mark.skipif(
    faiss_gpus() < 1, reason="faiss without CUDA or no GPU (install ragidx[gpu] on a GPU host)"
)
def test_exact_search_on_the_gpu_equals_the_cpu():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(7, 5007, dtype=np.int64)
    cpu = new_vector_index(VectorIndexSettings(requested="flat"), vectors, ids)
    queries = vectors[:50]
    expected_scores, expected_ids = cpu.search(queries, 10)
    assert cpu.use_gpu()
    scores, found = cpu.search(queries, 10)
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-4)
    allowed = ids[::7]  # filtered searches stay on the CPU index and stay exact
    np.testing.assert_array_equal(cpu.search(queries, 5, allowed=allowed)[1][:, 0] % 7, 0)


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
