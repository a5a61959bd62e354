"""Linear layers that hold float16 weights and compute in float32 (fbgemm's half-precision GEMM),
for CPUs without bf16 instructions.

A GGUF model is converted into a bfloat16 cache, and every bfloat16 value in float16's normal range
is a float16 value too (float16 has three more mantissa bits and, above 6.1e-5, the range), so
these weights are the cache's own, to the bit, for all but the tiniest weights: the vectors are
float32's, at half its memory. fbgemm packs the weights once and widens them to float32 inside its
kernel (F16C, on every AVX2 CPU), so a product reads 2 bytes a weight where float32 reads 4: a
query's few rows, which only stream weights, ran 4-6x faster than float32 and a build's batches as
fast or faster (docs/precision.md#float16-weights-float32-products). torch reaches the kernel
through its ``quantized`` operators; this module is the only place that names them.
"""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any

from ragidx.indexer.model.packed_linear import count_linear_flops, traceable_function

if TYPE_CHECKING:
    import torch
    from torch import nn


# A traced forward (ragidx.indexer.strategies.traced_readout) must call the product through a
# TorchScript function: called directly, the tracer records its output's sizes as the example row's
# constants, and the trace fails on a row of another length.
TRACEABLE_PRODUCT_IR = """
graph(%inputs : Tensor, %packed : __torch__.torch.classes.quantized.LinearPackedParamsBase):
  %output : Tensor = quantized::linear_dynamic_fp16(%inputs, %packed)
  return (%output)
"""


@functools.cache
def can_hold_half_weights() -> bool:
    """Whether this torch has fbgemm's float16-weight product (x86 builds do)."""
    import torch

    return "fbgemm" in torch.backends.quantized.supported_engines


def pack_half(weight: torch.Tensor) -> Any:
    """``weight`` ``[outputs, inputs]`` packed for fbgemm's product, rounded to float16."""
    import torch

    return torch.ops.quantized.linear_prepack_fp16(weight.detach().float(), None)


def half_product(inputs: torch.Tensor, packed: Any, bias: torch.Tensor | None) -> torch.Tensor:
    """``inputs @ weight.T + bias`` in float32 with the float16 ``packed`` weight."""
    import torch

    if torch.jit.is_tracing():
        result = traceable_function("half_linear", TRACEABLE_PRODUCT_IR)(inputs, packed)
    else:
        result = torch.ops.quantized.linear_dynamic_fp16(inputs, packed)
    return result if bias is None else result.add_(bias)


def hold_half(module: nn.Linear) -> None:
    """Replace ``module``'s weight by its packed float16 form (attribute ``half_weight``; ``weight``
    becomes None) and its forward by :func:`half_product`."""
    import torch

    count_linear_flops(torch.ops.quantized.linear_dynamic_fp16)  # for `ragidx bench`'s FLOP/s
    module.half_weight = pack_half(module.weight)  # fbgemm's packed object, not a tensor
    module.register_parameter("weight", None)
    if module.bias is not None:
        module.bias.data = module.bias.data.float()

    def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        return half_product(inputs, self.half_weight, self.bias)

    module.forward = types.MethodType(forward, module)  # type: ignore[method-assign] # this instance only
