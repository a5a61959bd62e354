"""Linear layers that hold int8 weights and compute in float32, for CPUs without bf16 instructions.

There a float32 model holds 4 bytes a weight (a 1B decoder: 6.7 GB of RSS; an 8B one does not fit
a laptop), and bf16 products are emulated at a hundredth of float32's speed. So each linear layer
keeps its weights as int8 in groups of :data:`GROUP` along a row, each group with its own scale
and offset (float16). That is how a GGUF file's 4- and 8-bit blocks are made (32 weights, a
scale and a minimum), so a GGUF model's weights come back almost exactly (cosine to float32's
vectors >= 0.9999 on the packaged models, against 0.997 with one scale per row;
docs/precision.md). A forward upcasts the weights a tile at a time into a float32 tile of 8 MB (32 for
a big batch), which stays in the CPU's cache while float32 products read it, and nothing else is
ever float32. The embedding matrix stays 16-bit (the GGUF cache's own values) and gives float32 rows.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

# Weights upcast at once: 2M (8 MB of float32), which stays in cache while the product reads it,
# for up to MANY_ROWS rows, and 8M beyond, where wider tiles keep the products efficient (measured on
# a 1B model's layers, int8 / float32 time: 0.88-1.02 at 16 and 256 rows with 2M, 0.99-1.00 at 2048
# rows with 8M; a whole layer at once: 1.4x at 256 rows, as its float32 copy goes through memory;
# docs/precision.md).
TILE_WEIGHTS = 1 << 21
MANY_ROWS, MANY_ROWS_TILE_WEIGHTS = 1024, 1 << 23
GROUP = 32  # weights sharing a scale and an offset: a GGUF block
LEVELS = 255  # an int8 spans 256 values: -128 .. 127


@dataclass(frozen=True)
class Int8Weight:
    """A weight ``[outputs, inputs]`` as int8 ``values`` and, per group of a row, float16
    ``scales`` and ``offsets``: weight = values x scale + offset."""

    values: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor

    @property
    def group(self) -> int:
        return int(self.values.shape[1] // self.scales.shape[1])


def group_size(width: int) -> int:
    """:data:`GROUP`, or the whole row where a row does not split into such groups."""
    return GROUP if width % GROUP == 0 else width


def to_int8(weight: torch.Tensor) -> Int8Weight:
    """``weight`` rounded to int8 a group at a time, each group spanning its own minimum to
    maximum (a group of equal weights gets scale 1). Rounded a tile of rows at a time in one
    float32 scratch: no working copy the size of a layer, nor freed ones that would leave the heap
    fragmented with the model's int8 weights among them (+0.5 GB of RSS on a 1B model)."""
    import torch

    weight = weight.detach()
    outputs, width = weight.shape
    group = group_size(width)
    values = torch.empty(outputs, width, dtype=torch.int8)
    scales = torch.empty(outputs, width // group, dtype=torch.float16)
    offsets = torch.empty_like(scales)
    step = max(1, TILE_WEIGHTS // width)
    scratch = torch.empty(min(step, outputs), width // group, group)
    for start in range(0, outputs, step):
        rows = scratch[: min(step, outputs - start)]
        rows.view(rows.shape[0], width).copy_(weight[start : start + step])
        lowest, highest = torch.aminmax(rows, dim=2)
        scale = ((highest - lowest) / LEVELS).half()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        offset = (lowest + 128 * scale.float()).half()  # the weight int8 0 stands for
        rows.sub_(offset.float()[..., None]).div_(scale.float()[..., None]).round_().clamp_(-128, 127)
        values[start : start + step] = rows.view(rows.shape[0], width)
        scales[start : start + step], offsets[start : start + step] = scale, offset
    return Int8Weight(values, scales, offsets)


def int8_product(inputs: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """``inputs @ weight.T + bias`` in float32, the int8 weight upcast a tile of rows at a time and
    each tile's product written straight into its columns of the result (the tile is allocated
    per call: thread-safe, traceable, and as fast as a kept buffer, since the allocator reuses it)."""
    import torch

    outputs, width = weight.values.shape
    flat = inputs.reshape(-1, width)
    tile_weights = TILE_WEIGHTS if flat.shape[0] < MANY_ROWS else MANY_ROWS_TILE_WEIGHTS
    step = max(1, tile_weights // width)
    tile = flat.new_empty(min(step, outputs), width)
    result = flat.new_empty(flat.shape[0], outputs)
    for start in range(0, outputs, step):
        rows = slice(start, start + step)
        part = tile[: min(step, outputs - start)].copy_(weight.values[rows])
        grouped = part.view(part.shape[0], -1, weight.group)
        grouped.mul_(weight.scales[rows, :, None]).add_(weight.offsets[rows, :, None])
        torch.mm(flat, part.t(), out=result[:, rows])
    if bias is not None:
        result.add_(bias)
    return torch.reshape(result, (*inputs.shape[:-1], outputs))


def held_int8(module: nn.Linear) -> Int8Weight:
    """The int8 weight :func:`hold_int8` gave ``module``."""
    names = ("int8_weight", "weight_scales", "weight_offsets")
    return Int8Weight(*(module.get_buffer(name) for name in names))


def float_weight(weight: Int8Weight) -> torch.Tensor:
    """``weight`` upcast to float32 whole (``values x scale + offset``)."""
    upcast = weight.values.float().view(weight.values.shape[0], -1, weight.group)
    upcast.mul_(weight.scales[..., None]).add_(weight.offsets[..., None])
    return upcast.view(weight.values.shape)


def hold_int8(module: nn.Linear) -> None:
    """Replace ``module``'s weight by its int8 form (buffers ``int8_weight``, ``weight_scales`` and
    ``weight_offsets``; ``weight`` becomes None) and its forward by :func:`int8_product`."""
    weight = to_int8(module.weight)
    module.register_buffer("int8_weight", weight.values, persistent=False)
    module.register_buffer("weight_scales", weight.scales, persistent=False)
    module.register_buffer("weight_offsets", weight.offsets, persistent=False)
    module.register_parameter("weight", None)
    if module.bias is not None:
        module.bias.data = module.bias.data.float()

    def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        return int8_product(inputs, held_int8(self), self.bias)

    module.forward = types.MethodType(forward, module)  # type: ignore[method-assign] # this instance only
