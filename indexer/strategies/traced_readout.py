"""One-row readouts recorded once with ``torch.jit.trace`` and replayed without Python.

A warm query on a small decoder is mostly per-operator overhead: SmolLM2's forward on one
20-token row issues thousands of small operators, each paying Python, transformers' module code,
hooks and the dispatcher. Tracing a strategy's readout of a single unpadded row records those
operators once, hooks and early exit included, as a TorchScript graph of the model's own
modules; replaying it gives the same vectors bit for bit (tests/test_traced_readout.py) in less
time (docs/precision.md).

Tracing takes about a second, so it happens at a strategy's second one-row readout: a one-shot
``ragidx query`` never pays for it, a server or a library user embedding query after query does
once. A trace fixes every Python decision the forward took for its example row, so it is replayed
only where those decisions cannot differ: one row (nothing padded, so no mask) of two tokens or
more (transformers attends a single token on a path of its own), on a CPU, with
rotary positions that do not depend on the length, and no longer than a sliding attention window.
On CUDA the replay was twice as fast but not equal to the eager forward (cosine 0.9962 on an
8B-shaped model, H200), and the eager one already answers in about 20 ms (docs/gpu.md): it stays off.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ragidx.indexer.model.runtime import Batch

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.model.runtime import ModelRuntime

log = logging.getLogger(__name__)

TRACE_AT_CALL = 2  # the first one-row readout runs eagerly; the second records the trace
# transformers attends a lone query token on a path of its own (grouped heads reshaped, not repeated),
# which a trace of a one-token row would fix for every longer row: shorter rows stay eager.
MIN_TRACED_TOKENS = 2
# A server settles a readout before its users' queries do: the first call runs eagerly, the second
# records the trace (about 2 s on SmolLM2) and TorchScript's executor profiles and optimises over the
# next replays (the first ~0.4 s, then ~25 ms), so these calls are what the first queries would pay.
SETTLING_CALLS = 3
SETTLING_TEXT = "what does this index hold about the subject"


def rope_types(config: Any) -> set[str]:
    """The rotary scalings a config asks for (``default`` where none), in transformers 4 or 5
    spelling, per layer type where a model has several (Gemma 3)."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    per_type = [value for value in parameters.values() if isinstance(value, dict)] or [parameters]
    return {str(each.get("rope_type") or each.get("type") or "default") for each in per_type}


def length_dependent(rope_type: str) -> bool:
    """Whether transformers recomputes this rotary scaling's frequencies from the sequence length
    (its ``dynamic_rope_update``: any ``dynamic`` type, and ``longrope``)."""
    return "dynamic" in rope_type or rope_type == "longrope"


def longest_traceable(runtime: ModelRuntime) -> int | None:
    """The longest row a trace may be replayed on (``None``: no limit), or 0 where none may be.

    A sliding window changes the mask once a row outgrows it, and length-dependent rotary
    scaling changes the positions' frequencies: a trace recorded on a shorter row would miss both.
    """
    config = runtime.model.config
    if runtime.device.type != "cpu" or any(length_dependent(kind) for kind in rope_types(config)):
        return 0
    return getattr(config, "sliding_window", None)


class TracedReadout:
    """Runs ``readout`` on one-row batches, through its recorded trace from the second call on."""

    def __init__(self, runtime: ModelRuntime, readout: Callable[[Batch], torch.Tensor]):
        self.runtime = runtime
        self.readout = readout
        self.limit = longest_traceable(runtime)
        self.calls = 0
        self.trace: Any = None
        self.failed = False

    def __call__(self, batch: Batch) -> torch.Tensor:
        if not self._replayable(batch):
            return self.readout(batch)
        self.calls += 1
        if self.trace is None and self.calls >= TRACE_AT_CALL:
            self.trace = self._record(batch)
        if self.trace is None:
            return self.readout(batch)
        import torch

        with torch.inference_mode():
            return self.trace(batch.input_ids)

    def _replayable(self, batch: Batch) -> bool:
        if self.failed or self.limit == 0 or batch.input_ids.shape[0] != 1:
            return False
        if batch.input_ids.shape[1] < MIN_TRACED_TOKENS:
            return False
        return self.limit is None or batch.input_ids.shape[1] <= self.limit

    def _record(self, batch: Batch) -> Any:
        """The readout traced on ``batch``'s row, or None (and eager from now on) if tracing fails."""
        import torch

        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer warns about every Python decision it fixes
                return torch.jit.trace(
                    _one_row_module(self.runtime.model, self.readout), (batch.input_ids,), check_trace=False
                )
        except Exception as error:  # an architecture whose forward cannot be traced stays eager
            log.debug("one-row readout not traced: %s", error)
            self.failed = True
            return None


def _one_row_module(model: torch.nn.Module, readout: Callable[[Batch], torch.Tensor]) -> torch.nn.Module:
    """``readout`` of the one-row batch of some ids, as a module holding ``model`` (so that the
    trace reads the weights as the module's attributes instead of copying them in as constants)."""
    import torch

    class OneRow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return readout(Batch.single(input_ids))

    return OneRow()


def settle(strategy: Any) -> None:
    """Record and optimise ``strategy``'s traced query readout now (:data:`SETTLING_CALLS` one-text
    query embeddings), where it has one: for a server about to answer its first requests."""
    if getattr(strategy, "one_row", None) is None:
        return
    for _ in range(SETTLING_CALLS):
        strategy.encode([SETTLING_TEXT], "query")
