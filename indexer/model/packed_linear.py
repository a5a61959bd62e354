"""CPU linear layers with their weights reordered for oneDNN once, not on every call: bf16
always (where oneDNN runs it), float32 where a probe measures it faster than torch's own product.

oneDNN's bf16 matrix product repacks a plain weight into its blocked (VNNI) layout on every
call. At the few rows of a query that repacking dominates: SmolLM2's 210 products per forward
ran at about 6 GB/s of weights against ~30 GB/s of memory bandwidth. Reordering each weight once,
as torch.compile's freezing pass does, gives bit-identical outputs, halves a decoder query's
latency and speeds builds by about a sixth (docs/precision.md). torch's float32 products go
through MKL, which on AMD CPUs keeps to slower code paths: there oneDNN's packed float32 products
ran 1.2-1.9x faster held to AVX2 and 2.3-3.7x with AVX-512 (20-2,048 rows of Gemma's and SmolLM2's
layers), with outputs equal to rounding (relative 1e-6). The plain weight is dropped once packed
(nothing reads it; the forward is replaced), so the packed model takes the memory of the plain
one, not twice it.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

X86_MACHINES = ("x86_64", "amd64", "i686", "x86")


def _packing_ops(dtype: torch.dtype) -> tuple[Any, Any] | None:
    """torch's oneDNN reorder and packed-linear operators for ``dtype`` weights, or None where this
    torch lacks them, the CPU is not x86 (float32: elsewhere oneDNN is not what torch builds on),
    or it cannot run oneDNN's bf16 products (no AVX-512 BW/VL/DQ nor AVX-NE-CONVERT: the reorder
    refuses bf16 there, and plain products are emulated anyway)."""
    import torch

    supported = {
        torch.bfloat16: lambda: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        torch.float32: lambda: platform.machine().lower() in X86_MACHINES,
    }
    try:
        if dtype not in supported or not (torch.backends.mkldnn.is_available() and supported[dtype]()):
            return None
        return torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


def can_pack_linear_weights(dtype: str = "bfloat16") -> bool:
    """Whether :func:`pack_linear_weights` can pack ``dtype`` weights on this CPU."""
    import torch

    return _packing_ops(getattr(torch, dtype)) is not None


def count_linear_flops(linear: Any) -> None:
    """Teach torch's FLOP counter a linear operator of its own (2 x rows x inputs x outputs), once:
    the packed products here, float16 weights' in :mod:`~ragidx.indexer.model.half_weights`."""
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
def traceable_function(name: str, ir: str) -> Any:
    """A TorchScript function of a graph written in its IR (made once per graph): what a traced
    forward calls for an operator the tracer cannot record directly."""
    import torch

    return torch._C._create_function_from_graph(name, torch._C.parse_ir(ir))


def pack_linear_weights(model: nn.Module) -> int:
    """Give every CPU ``nn.Linear`` of a bf16 or float32 ``model`` a pre-packed weight; returns how
    many (0 where this CPU cannot pack that dtype: see :func:`can_pack_linear_weights`). The caller
    decides whether float32 pays (:func:`ragidx.indexer.model.precision.measured_precision`).

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

    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return 0
    ops = _packing_ops(first.dtype)
    if ops is None:
        return 0
    reorder, linear = ops
    count_linear_flops(linear)
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None or weight.dtype != first.dtype:
            for parameter in module.parameters(recurse=False):
                parameter.data = parameter.data.clone()  # out of the file's mapping
            continue
        module.register_buffer("packed_weight", reorder(weight.detach()), persistent=False)
        module.register_parameter("weight", None)

        def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
            if torch.jit.is_tracing():
                return traceable_function("packed_linear", TRACEABLE_PRODUCT_IR)(
                    inputs, self.packed_weight, self.bias
                )
            return linear(inputs, self.packed_weight, self.bias, "none", [], "")

        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign] # this instance only
        packed += 1
    return packed
