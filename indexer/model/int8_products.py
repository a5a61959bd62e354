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
column's largest weight), then each token's inputs are multiplied by random signs and blocks of 64
of them by the orthonormal Hadamard matrix, the weights' columns by the same (QuaRot's rotation):
the float product is unchanged, but an outlier left after migration is spread over its block, so a
token's 7 bits are not spent on one channel (SmolLM2's `aligned-wva`: smallest cosine to float32
0.9861 without, 0.9980 with). docs/integer-products.md measures what each strategy's vectors keep.
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
ROTATION_BLOCK = 64  # inputs mixed in blocks of 64 (or of the largest power of two dividing their number)
ROTATED_ROWS = 128  # a weight's rows rotated this many at a time, in place: a 1B layer adds 4 MB

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
    """A weight ``[outputs, inputs]`` as fbgemm holds it (``packed``: per-row int8), the factors its
    inputs take first (signs over migration divisors; None: neither), the rotation that follows
    (None: none) and each output's sum of the int8 weights times their scale (``row_sums``: what a
    token's offset contributes)."""

    packed: Any
    input_factors: torch.Tensor | None
    rotation: torch.Tensor | None
    row_sums: torch.Tensor


@functools.cache
def rotation_block(inputs: int) -> torch.Tensor:
    """The orthonormal (and symmetric) Hadamard matrix, Sylvester's, of :data:`ROTATION_BLOCK` rows
    or of the largest power of two dividing ``inputs`` where that is smaller."""
    import torch

    size = min(ROTATION_BLOCK, inputs & -inputs)
    block = torch.ones(1, 1)
    while len(block) < size:
        block = torch.cat([torch.cat([block, block], 1), torch.cat([block, -block], 1)])
    return block / size**0.5


@functools.cache
def rotation_signs(inputs: int) -> torch.Tensor:
    """Random signs, one per input, the same for every layer of ``inputs`` inputs in every process
    (seeded by the number): a model's vectors never depend on the run."""
    import torch

    chosen = torch.randint(0, 2, (inputs,), generator=torch.Generator().manual_seed(inputs))
    return chosen * 2.0 - 1.0


def rotated(rows: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Each row's consecutive blocks of inputs multiplied by ``block`` (a new tensor)."""
    return (rows.unflatten(-1, (-1, len(block))) @ block).flatten(-2)


def migration_divisors(weight: torch.Tensor, largest_inputs: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's per-input divisors ``a_j^alpha / w_j^(1-alpha)`` (``a_j``: input ``j``'s largest
    value seen, ``w_j``: its column's largest weight)."""
    columns = weight.abs().amax(0).clamp_min(SMALLEST) ** (1 - MIGRATION_STRENGTH)
    return largest_inputs.float().clamp_min(SMALLEST) ** MIGRATION_STRENGTH / columns


def integer_weight(
    weight: torch.Tensor, largest_inputs: torch.Tensor | None = None, rotate: bool = True
) -> IntegerWeight:
    """``weight`` (any float dtype), its columns multiplied by :func:`migration_divisors` where the
    inputs' largest values are given, then (``rotate``) by :func:`rotation_signs` and its rows'
    blocks by :func:`rotation_block`, rounded to int8 with one symmetric scale per row and packed.
    Rounded in one float32 copy, in place: a 1B model converts a layer at a time beside its int8
    weights, and every other working copy would add to its peak."""
    import torch

    rounded = weight.detach().float() if weight.dtype != torch.float32 else weight.detach().clone()
    inputs = rounded.shape[1]
    factors = None if largest_inputs is None else migration_divisors(rounded, largest_inputs)
    block = rotation_block(inputs) if rotate else None
    if block is not None:
        factors = rotation_signs(inputs) if factors is None else factors.mul_(rotation_signs(inputs))
    if factors is not None:
        rounded.mul_(factors)
    if block is not None:
        for start in range(0, len(rounded), ROTATED_ROWS):
            part = rounded[start : start + ROTATED_ROWS]
            part.copy_(rotated(part, block))
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
    # the signs are their own inverse: the inputs take signs over divisors
    return IntegerWeight(packed, None if factors is None else 1.0 / factors, block, row_sums)


def rows_on_levels(inputs: torch.Tensor, weight: IntegerWeight) -> tuple[torch.Tensor, ...]:
    """``inputs`` (times ``weight``'s input factors, then rotated as its columns were) with each row
    moved and scaled onto 0..127 (a new tensor, not yet rounded: the kernel rounds), and each row's
    lowest value and step."""
    import torch

    scaled = inputs * weight.input_factors if weight.input_factors is not None else inputs.clone()
    if weight.rotation is not None:
        scaled = rotated(scaled, weight.rotation)
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
    rotate: bool = True,
) -> None:
    """Give ``module`` the int8 form of ``weight`` (fbgemm's packed object as attribute
    ``integer_weight``, which a trace finds there; buffers ``input_factors``, ``rotation`` and
    ``row_sums``; ``weight`` and any other held form are dropped) and ``product``
    (:func:`integer_product`; a benchmark passes another rounding of the activations, or no
    rotation) as its forward."""
    count_linear_flops(integer_kernel())  # for `ragidx bench`'s FLOP/s
    held = integer_weight(weight, largest_inputs, rotate)
    for name in ("int8_weight", "weight_scales", "weight_offsets"):
        module._buffers.pop(name, None)
    module.register_parameter("weight", None)
    module.integer_weight = held.packed
    module.register_buffer("input_factors", held.input_factors, persistent=False)
    module.register_buffer("rotation", held.rotation, persistent=False)
    module.register_buffer("row_sums", held.row_sums, persistent=False)
    if module.bias is not None:
        module.bias.data = module.bias.data.float()

    def forward(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers  # input_factors and rotation may be None
        held = IntegerWeight(
            self.integer_weight, buffers["input_factors"], buffers["rotation"], self.get_buffer("row_sums")
        )
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
