"""Embedding distributed with Ray Data (``ragidx build --ray [ADDRESS]``).

The documents to embed become a Ray dataset of paths; ``map_batches`` hands them to actor
workers that each load the model and the strategy once (from the build's resolved parameters, so
each computes what the single-process build would) and return their chunks and vectors.
The driver writes them in the documents' order into the same pending generation, which commits
only once every vector is in. A worker process that dies is restarted by Ray and its batch done
again; an error that stops the dataset, or a lost cluster, leaves the previous generation as it
was. Ray is an optional extra (``pip install 'ragidx[ray]'``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragidx.indexer.build.embedding import Embedded, embed_records, read_record
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import SkippedFile, SourceDocument
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.model.sources import ModelSource
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.storage.database import DocumentRecord
from ragidx.indexer.storage.writer import NextGeneration
from ragidx.indexer.strategies import BatchSettings, Strategy, strategy_from_index

LOCAL = "local"  # --ray without an address: a cluster on this machine, for this build only
DOCUMENTS_PER_TASK = 16
PROBE_SECONDS = 5


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to embed exactly as the driver's strategy would."""

    source: ModelSource
    device: str
    dtype: str  # the driver's resolved precision, so every worker computes in the same one
    trust_remote_code: bool
    strategy: str
    params: dict[str, Any]
    batch: BatchSettings
    chunker: dict[str, Any]  # the build's Chunker.settings
    access: FileAccess  # what the build may open


@dataclass
class WorkerBatch:
    """A batch of documents as a worker saw it: records and their vectors (one row per chunk, in
    record order), the files it had to skip, and how many chunks were cut to the max length."""

    records: list[DocumentRecord]
    vectors: np.ndarray
    skipped: list[SkippedFile]
    truncated: int

    @property
    def documents(self) -> int:
        return len(self.records) + len(self.skipped)


class DocumentEmbedder:
    """A Ray actor: reads, chunks and embeds the documents of each batch of paths it is given,
    all their chunks in one pass as a local build embeds a group of documents."""

    def __init__(self, spec: WorkerSpec):
        runtime = load_runtime(spec.source, spec.device, spec.dtype, spec.trust_remote_code)
        self.strategy: Strategy = strategy_from_index(spec.strategy, runtime, spec.params, batch=spec.batch)
        self.chunker = Chunker(runtime.tokenizer, **spec.chunker)
        self.access = spec.access

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        records: list[DocumentRecord] = []
        skipped: list[SkippedFile] = []
        for path in batch["path"]:
            record = read_record(str(path), self.chunker, self.access)
            if isinstance(record, SkippedFile):
                skipped.append(record)
            else:
                records.append(record)
        before = self.strategy.truncated
        vectors = embed_records(self.strategy, records)
        done = WorkerBatch(records, vectors, skipped, self.strategy.truncated - before)
        return {"output": np.array([done], dtype=object)}


def connect(address: str, workers: int | None, device: str = "auto") -> int:
    """Join the Ray cluster at ``address`` (``local``: start one on this machine) and return how
    many workers to run: ``workers``, else one per CPU of the cluster (per GPU for ``cuda``)."""
    try:
        import ray
    except ImportError:
        raise RagidxError("--ray needs Ray: pip install 'ragidx[ray]'") from None
    if workers is not None and workers < 1:
        raise RagidxError(f"--ray-workers must be at least 1, got {workers}")
    if not ray.is_initialized():
        if address != LOCAL:
            _probe(address)
        try:
            if address == LOCAL:
                ray.init(
                    num_cpus=os.cpu_count(),
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                )
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except Exception as error:  # Ray raises several kinds (ConnectionError, RuntimeError, ValueError)
            raise RagidxError(f"cannot reach the Ray cluster at {address}: {_cause(error)}") from None
    if device != "cuda":
        return workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus == 0 or (workers or 0) > gpus:
        raise RagidxError(
            f"--device cuda: {workers or 1} Ray worker(s) need a GPU each, the cluster has {gpus}"
        )
    return workers or gpus


def _probe(address: str) -> None:
    """Refuse a ``host:port`` address nothing answers at within seconds (Ray itself retries for
    minutes); ``auto`` and other forms are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_SECONDS).close()
    except OSError as error:
        raise RagidxError(f"cannot reach the Ray cluster at {address}: {error.strerror or error}") from None


def embed_documents_on_ray(
    documents: Sequence[SourceDocument],
    spec: WorkerSpec,
    address: str,
    workers: int,
    pending: NextGeneration,
    progress: bool,
) -> Embedded:
    """Embed ``documents`` on ``workers`` workers of the cluster :func:`connect` joined and hand
    each batch of results to ``pending`` in the documents' order (so chunk ids come out as a local
    build's would); a cluster started for this build is stopped after it."""
    import ray

    try:
        return _embed_on_cluster(documents, spec, workers, pending, progress)
    finally:
        if address == LOCAL:
            ray.shutdown()


def _embed_on_cluster(
    documents: Sequence[SourceDocument], spec: WorkerSpec, count: int, pending: NextGeneration, progress: bool
) -> Embedded:
    import ray
    import ray.data

    embedded = Embedded()
    if not documents:
        return embedded
    started = time.perf_counter()
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # ragidx shows its own progress bar
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    cpus = float(ray.cluster_resources().get("CPU", 1)) / count  # a share each, so all of them fit
    dataset = ray.data.from_items([{"path": document.path} for document in documents]).map_batches(
        DocumentEmbedder,
        fn_constructor_kwargs={"spec": spec},
        batch_size=DOCUMENTS_PER_TASK,
        compute=ray.data.ActorPoolStrategy(size=count),
        num_cpus=cpus,
        num_gpus=1 if spec.device == "cuda" else 0,
    )
    try:
        with progress_bar(len(documents), "embedding", "documents", progress) as bar:
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                for done in batch["output"]:
                    embedded.skipped += done.skipped
                    embedded.truncated += done.truncated
                    for record in done.records:
                        embedded.count(record)
                    if done.records:
                        pending.add(done.records, done.vectors)
                    bar.update(done.documents)
        embedded.embedded_tokens = embedded.tokens
    except Exception as error:  # a worker failed or the cluster went away: nothing was committed
        raise RagidxError(f"the Ray build failed, the index is unchanged: {_cause(error)}") from None
    embedded.seconds = time.perf_counter() - started
    return embedded


def _cause(error: BaseException) -> str:
    """The first line of what went wrong on the worker (Ray wraps it), else of ``error``."""
    while getattr(error, "cause", None) is not None and error.cause is not error:  # type: ignore[attr-defined]
        error = error.cause  # type: ignore[attr-defined]
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
