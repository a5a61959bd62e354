"""Linear layers that multiply int8 activations by int8 weights (W8A8) on a CPU, through fbgemm.

On a CPU without bf16 instructions float32 is the only fast float arithmetic, and a 1B decoder's
float32 products run at a fraction of what its integer units do: llama.cpp is fast there because it
multiplies int8 activations by the file's int8 blocks. Here each weight row is int8 with its own
scale, and each token's activations are rounded with their own offset and scale as they arrive, so a
chunk's vector never depends on the other rows of its batch (what the journal's resumed builds and
the daemon's batched queries rely on): the integer sums are exact, and every scale is one row's own.

Activations take 7 bits (0..127), not 8: on AVX2 the kernel adds pairs of u8 x s8 products in
int16 (``vpmaddubsw``), which saturates beyond 2 x 127 x 127, and 8-bit activations put 9.6% of
error into a random layer's output (exact to 5e-8 with 7 bits; ``tests/test_int8_products.py``).
The activations' outlier channels, which would take a token's whole scale, are moved into the
weights first (SmoothQuant: input ``j`` divided by ``m_j = a_j^alpha / w_j^(1-alpha)``, its column of
weights multiplied by it, ``a_j`` its largest value seen on fixed calibration texts and ``w_j`` its
column's largest weight). docs/integer-products.md measures what each strategy's vectors keep.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragidx.indexer.model.calibration_texts import CALIBRATION_TEXTS
from ragidx.indexer.model.half_weights import can_hold_half_weights
from ragidx.indexer.model.int8_weights import float_weight, held_int8
from ragidx.indexer.model.packed_linear import count_linear_flops, traceable_function

if TYPE_CHECKING:
    import torch
    from torch import nn

ACTIVATION_LEVELS = 127  # 7 bits: the most an AVX2 kernel sums without saturating int16
WEIGHT_LEVELS = 127  # symmetric int8 weights, one scale per row (fbgemm's per-channel product)
MIGRATION_STRENGTH = 0.5  # SmoothQuant's alpha: the activations' range shared evenly with the weights
SMALLEST = 1e-5  # floor of a column's largest input or weight, so an unused one divides by no zero

# A traced forward (ragidx.indexer.strategies.traced_readout) calls the product through a
# TorchScript function: called directly, the tracer would record the example row's sizes.
TRACEABLE_PRODUCT_IR = """
graph(%inputs : Tensor, %zero : int, %packed : __torch__.torch.classes.quantized.LinearPackedParamsBase):
  %scale : float = prim::Constant[value=1.0]()
  %output : Tensor = quantized::linear_with_input_q_dq_qweight_dq_output_fp32(%inputs, %scale, %zero, %packed)
  return (%output)
"""


@functools.cache
def integer_kernel() -> Any:
    """fbgemm's int8 product, float32 in and out (torch is imported where first needed)."""
    import torch

    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32


def can_multiply_integers() -> bool:
    """Whether this torch has fbgemm's int8 product: where it has fbgemm's float16-weight one."""
    return can_hold_half_weights()


@dataclass(frozen=True)
class IntegerWeight:
    """A weight ``[outputs, inputs]`` as fbgemm holds it (``packed``: per-row int8), the divisors its
    inputs take first (None: no migration) and each output's sum of the int8 weights times their
    scale (``row_sums``: what a token's offset contributes)."""

    packed: Any
    input_divisors: torch.Tensor | None
    row_sums: torch.Tensor


def migration_divisors(weight: torch.Tensor, largest_inputs: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's per-input divisors ``a_j^alpha / w_j^(1-alpha)`` (``a_j``: input ``j``'s largest
    value seen, ``w_j``: its column's largest weight)."""
    columns = weight.abs().amax(0).clamp_min(SMALLEST) ** (1 - MIGRATION_STRENGTH)
    return largest_inputs.float().clamp_min(SMALLEST) ** MIGRATION_STRENGTH / columns


def integer_weight(weight: torch.Tensor, largest_inputs: torch.Tensor | None = None) -> IntegerWeight:
    """``weight`` (any float dtype), its columns multiplied by :func:`migration_divisors` where the
    inputs' largest values are given, rounded to int8 with one symmetric scale per row and packed.
    Rounded in one float32 copy, in place: a 1B model converts a layer at a time beside its int8
    weights, and every other working copy would add to its peak."""
    import torch

    rounded = weight.detach().float() if weight.dtype != torch.float32 else weight.detach().clone()
    divisors = None if largest_inputs is None else migration_divisors(rounded, largest_inputs)
    if divisors is not None:
        rounded.mul_(divisors)
    scales = rounded.abs().amax(1).clamp_min_(1e-12).div_(WEIGHT_LEVELS)
    rounded.div_(scales[:, None]).round_().clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS)
    row_sums = rounded.sum(1).mul_(scales)
    values = rounded.to(torch.int8)
    del rounded
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch deprecates quantized tensors; fbgemm's packing takes one
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch._make_per_channel_quantized_tensor(values, scales.double(), zeros, 0)
    packed = torch.ops.quantized.linear_prepack(quantized, None)
    return IntegerWeight(packed, None if divisors is None else 1.0 / divisors, row_sums)


def rows_on_levels(inputs: torch.Tensor, weight: IntegerWeight) -> tuple[torch.Tensor, ...]:
    """``inputs`` (divided by ``weight``'s migration divisors) with each row moved and scaled onto
    0..127 (a new tensor, not yet rounded: the kernel rounds), and each row's lowest value and step."""
    import torch

    scaled = inputs * weight.input_divisors if weight.input_divisors is not None else inputs.clone()
    lowest, highest = torch.aminmax(scaled, dim=-1, keepdim=True)
    step = (highest - lowest).clamp_min(1e-12) / ACTIVATION_LEVELS
    return scaled.sub_(lowest).div_(step), lowest, step


def integer_product(inputs: torch.Tensor, weight: IntegerWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``inputs @ weight.T + bias`` with each row of ``inputs`` rounded to 7 bits between its own
    lowest and highest value: ``x = lowest + step * q``, so the product is ``step * (q @ W.T) +
    lowest * row_sums``, the first term exact in integers."""
    import torch

    scaled, lowest, step = rows_on_levels(inputs, weight)
    if torch.jit.is_tracing():
        result = traceable_function("integer_linear", TRACEABLE_PRODUCT_IR)(scaled, 0, weight.packed)
    else:
        result = integer_kernel()(scaled, 1.0, 0, weight.packed)
    result.mul_(step).addcmul_(lowest, weight.row_sums)
    return result if bias is None else result.add_(bias)


def hold_integer(
    module: nn.Linear,
    weight: torch.Tensor,
    largest_inputs: torch.Tensor | None,
    product: Callable[..., torch.Tensor] = integer_product,
) -> None:
    """Give ``module`` the int8 form of ``weight`` (fbgemm's packed object as attribute
    ``integer_weight``, which a trace finds there; buffers ``input_divisors`` and ``row_sums``;
    ``weight`` and any other held form are dropped) and ``product`` (:func:`integer_product`;
    a benchmark passes another rounding of the activations) as its forward."""
    count_linear_flops(integer_kernel())  # for `ragidx bench`'s FLOP/s
    held = integer_weight(weight, largest_inputs)
    for name in ("int8_weight", "weight_scales", "weight_offsets"):
        module._buffers.pop(name, None)
    module.register_parameter("weight", None)
    module.integer_weight = held.packed
    module.register_buffer("input_divisors", held.input_divisors, persistent=False)
    module.register_buffer("row_sums", held.row_sums, persistent=False)
    if module.bias is not None:
        module.bias.data = module.bias.data.float()

    def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers  # input_divisors is None where nothing was migrated
        held = IntegerWeight(self.integer_weight, buffers["input_divisors"], self.get_buffer("row_sums"))
        return product(inputs, held, self.bias)

    module.forward = types.MethodType(forward, module)  # type: ignore[method-assign] # this instance only


def largest_inputs(model: nn.Module, tokenizer: Any) -> dict[nn.Linear, torch.Tensor]:
    """Each linear layer's largest input per channel (absolute) while ``model`` reads
    :data:`~ragidx.indexer.model.calibration_texts.CALIBRATION_TEXTS`, one text at a time: short
    texts, as most chunks and queries are, show the channels a text's first tokens make large
    (read as one joined text, SmolLM2's `aligned-wva` lost 5.1 STS-B points, against 1.75)."""
    import torch

    largest: dict[nn.Linear, torch.Tensor] = {}

    def record(module: nn.Linear, arguments: tuple[torch.Tensor, ...]) -> None:
        seen = arguments[0].detach().abs().reshape(-1, arguments[0].shape[-1]).amax(0).float()
        if module in largest:
            torch.maximum(largest[module], seen, out=largest[module])
        else:
            largest[module] = seen

    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    hooks = [module.register_forward_pre_hook(record) for module in linears]
    try:
        with torch.inference_mode():
            for text in CALIBRATION_TEXTS:
                ids = torch.tensor([tokenizer(text)["input_ids"]])
                model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return largest


def hold_integer_products(model: nn.Module, tokenizer: Any) -> None:
    """Turn every linear layer of ``model``, loaded with int8 weights
    (:func:`~ragidx.indexer.model.int8_weights.hold_int8`: the GGUF's blocks almost exactly, at 1.25
    bytes a weight), into integer products, migrated by the largest inputs each saw on the
    calibration texts; a layer at a time, so a float32 copy of one layer is all that is added."""
    largest = largest_inputs(model, tokenizer)
    for module, seen in largest.items():
        give_back_freed_memory()  # the calibration's activations, then each layer's int8 weights
        hold_integer(module, float_weight(held_int8(module)), seen)
    give_back_freed_memory()


def give_back_freed_memory() -> None:
    """Return the C library's freed heap to the OS (glibc's ``malloc_trim``; elsewhere nothing).
    Converting a 1B model, the freed int8 weights stayed in the process beside the packed ones
    that replaced them (peak 2.8 GB, 1.5 GB once trimmed at the end)."""
    library = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None
    if trim is not None:
        trim(0)
