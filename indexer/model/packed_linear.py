"""bf16 linear layers on a CPU with their weights reordered for oneDNN once, not on every call.

oneDNN's bf16 matrix product repacks a plain weight into its blocked (VNNI) layout on every
call. At the few rows of a query that repacking dominates: SmolLM2's 210 products per forward
ran at about 6 GB/s of weights against ~30 GB/s of memory bandwidth. Reordering each weight once,
as torch.compile's freezing pass does, gives bit-identical outputs, halves a decoder query's
latency and speeds builds by about a sixth (docs/precision.md). The plain weight is dropped once
packed (nothing reads it; the forward is replaced), so the packed model takes the memory of the
plain one, not twice it.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


def _packing_ops() -> tuple[Any, Any] | None:
    """torch's oneDNN reorder and packed-linear operators, or None where this torch lacks them or
    this CPU cannot run oneDNN's bf16 products (no AVX-512 BW/VL/DQ nor AVX-NE-CONVERT: the
    reorder refuses bf16 there, and plain products are emulated anyway)."""
    import torch

    try:
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return None
        return torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


def can_pack_linear_weights() -> bool:
    """Whether :func:`pack_linear_weights` packs bf16 weights on this CPU."""
    return _packing_ops() is not None


def _count_flops_of_packed_products(linear: Any) -> None:
    """Teach torch's FLOP counter the packed product (2 x rows x inputs x outputs), once."""
    from torch.utils.flop_counter import register_flop_formula

    def flops(inputs: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        rows = 1
        for size in inputs[:-1]:
            rows *= size
        return 2 * rows * inputs[-1] * out_shape[-1]

    with contextlib.suppress(RuntimeError):  # registered already, by an earlier model in this process
        register_flop_formula(linear)(flops)


# TorchScript's tracer cannot record the packed product's empty ``Scalar?[]`` argument, so a traced
# forward calls it through this graph, written in TorchScript's IR (its Python frontend cannot
# spell that list type either).
TRACEABLE_PRODUCT_IR = """
graph(%inputs : Tensor, %blocked : Tensor, %bias : Tensor?):
  %attr : str = prim::Constant[value="none"]()
  %algorithm : str = prim::Constant[value=""]()
  %scalars : Scalar?[] = prim::ListConstruct()
  %output : Tensor = mkldnn::_linear_pointwise(%inputs, %blocked, %bias, %attr, %scalars, %algorithm)
  return (%output)
"""


@functools.cache
def _traceable_product() -> Any:
    import torch

    return torch._C._create_function_from_graph("packed_linear", torch._C.parse_ir(TRACEABLE_PRODUCT_IR))


def pack_linear_weights(model: nn.Module) -> int:
    """Give every bf16 CPU ``nn.Linear`` of ``model`` a pre-packed weight; returns how many.

    The packed copy replaces ``weight`` (which becomes None) as a non-persistent buffer
    ``packed_weight``, so a traced forward (see :mod:`ragidx.indexer.strategies.traced_readout`)
    reads it as the module's attribute. No strategy reads a linear layer's weight; one that did
    would fail loudly on None rather than read a stale copy.

    transformers loads safetensors memory-mapped, and packing reads every page of the files, which
    then count in the process's memory beside the packed copies (a 1B model: 4.3 GB, not 2.2). So
    the other weights (embeddings, norms) are copied out of the mapping as the modules are passed
    in order, and each file's mapping closes once none of its weights is left in it: the packed
    model then holds the memory of the plain one (peak: 3.0 GB for the 1B model).
    """
    import torch

    ops = _packing_ops()
    first = next(model.parameters(), None)
    if ops is None or first is None:
        return 0
    if first.dtype != torch.bfloat16 or first.device.type != "cpu":
        return 0
    reorder, linear = ops
    _count_flops_of_packed_products(linear)
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None or weight.dtype != torch.bfloat16:
            for parameter in module.parameters(recurse=False):
                parameter.data = parameter.data.clone()  # out of the file's mapping
            continue
        module.register_buffer("packed_weight", reorder(weight.detach()), persistent=False)
        module.register_parameter("weight", None)

        def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
            if torch.jit.is_tracing():
                return _traceable_product()(inputs, self.packed_weight, self.bias)
            return linear(inputs, self.packed_weight, self.bias, "none", [], "")

        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign] # this instance only
        packed += 1
    return packed
