"""Models whose linear layers hold leaner weights than the float32 they compute in (int8 or
float16 weights: :mod:`~ragidx.indexer.model.int8_weights`, :mod:`~ragidx.indexer.model.half_weights`),
for CPUs without bf16 instructions, where float32 is the only fast arithmetic."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


def _float32_rows(embedding: nn.Embedding) -> None:
    """Let a 16-bit embedding matrix give float32 rows, scaled in float32 where the family scales
    them (Gemma's ``embed_scale``, which its own forward applies in the matrix's dtype), so they
    equal a float32 matrix's rows and the layers after it compute in float32."""
    import torch

    def forward(self: nn.Embedding, inputs: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.Embedding.forward(self, inputs).float()
        scale = getattr(self, "embed_scale", None)
        return rows if scale is None else rows * scale.float()

    embedding.forward = types.MethodType(forward, embedding)  # type: ignore[method-assign] # this instance only


def hold_linear_weights(model: Any, hold: Callable[[nn.Linear], None]) -> None:
    """Give every ``nn.Linear`` of ``model`` (loaded 16-bit, on the CPU) its held weights through
    ``hold``, keep the input embedding 16-bit with float32 rows, and make every other weight
    float32. As :func:`~ragidx.indexer.model.packed_linear.pack_linear_weights` does, each weight is
    copied out of the safetensors mapping as it is passed, so a file's mapping closes once none of
    its weights is left in it and the model never holds its 16-bit self beside it.
    """
    import torch

    embedding = model.get_input_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not None:
            hold(module)
            continue
        for parameter in module.parameters(recurse=False):
            dtype = parameter.dtype if module is embedding else torch.float32
            parameter.data = parameter.data.to(dtype, copy=True)  # out of the file's mapping
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point() and module is not embedding:
                setattr(module, name, buffer.float())
    _float32_rows(embedding)
