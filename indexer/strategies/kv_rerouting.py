"""KV re-routing inside attention (KV-Embedding, methods.md §5) as a transformers attention function.

The wrapper is registered once in transformers' ``AttentionInterface`` (and its mask interface)
under a name per base implementation. For the duration of one forward pass the model's config
points at the wrapper: at the selected layers it prepends each row's last real key/value as a
prefix every query sees, with a bias on that column; every other layer gets the model's own
function with its own mask, untouched. Afterwards the config is restored, so other strategies
sharing the model never see the wrapper.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ragidx.indexer.model.runtime import ModelRuntime

BASE_IMPLEMENTATIONS = ("sdpa", "eager")
WRAPPER_PREFIX = "ragidx-kv-reroute-"
REROUTING_ATTRIBUTE = "ragidx_kv_rerouting"


@dataclass(frozen=True)
class Rerouting:
    """What one selected layer needs: the bias of the prefix column and each row's last real token."""

    bias: float
    last_positions: torch.Tensor


def _base_function(module: nn.Module, base: str) -> Any:
    """The function the model would have used: SDPA from the registry, eager from its own modeling file."""
    if base == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sys.modules[type(module).__module__].eager_attention_forward


def _wrapper_for(base: str) -> Any:
    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        rerouting = getattr(module, REROUTING_ATTRIBUTE, None)
        if rerouting is None:
            return _base_function(module, base)(module, query, key, value, attention_mask, **kwargs)
        scaling = kwargs.get("scaling")
        return (
            rerouted_attention(
                query,
                key,
                value,
                attention_mask,
                scaling=cast(int, module.head_dim) ** -0.5 if scaling is None else scaling,
                softcap=kwargs.get("softcap"),
                rerouting=rerouting,
            ),
            None,
        )

    return attention


_registered: set[str] = set()


def _register(base: str) -> str:
    """Register the wrapper for ``base`` (once per process) with the mask function ``base`` uses."""
    name = WRAPPER_PREFIX + base
    if name not in _registered:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(name, _wrapper_for(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _registered.add(name)
    return name


def additive_mask(attention_mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
    """The layer's causal + padding mask as [B or 1, 1, T, T] additive floats (0 or the dtype's minimum).

    SDPA masks arrive as booleans (True = attend) or as None when nothing is padded (plain causal);
    eager masks are already additive.
    """
    import torch

    length = query.shape[2]
    lowest = torch.finfo(query.dtype).min
    if attention_mask is None:
        causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
        attention_mask = causal[None, None]
    if attention_mask.dtype == torch.bool:
        zeros = torch.zeros((), dtype=query.dtype, device=query.device)
        return torch.where(attention_mask, zeros, lowest)
    return attention_mask.to(query.dtype)


def rerouted_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float,
    softcap: float | None,
    rerouting: Rerouting,
) -> torch.Tensor:
    """softmax([q·k_n·s + b ; q·Kᵀ·s + mask])·[v_n ; V] per head, as [B, T, heads, head_dim].

    ``query`` is [B, H, T, d]; ``key``/``value`` are [B, H_kv, T, d] after RoPE (and any q/k norm),
    exactly what the layer's own attention would use. With a logit soft-cap (Gemma 2) the bias is
    added after capping, so b shifts the final pre-softmax logit as in the paper.
    """
    import torch

    batch, heads, length, _ = query.shape
    rows = torch.arange(batch, device=query.device)
    last = rerouting.last_positions.to(query.device)
    keys = torch.cat([key[rows, :, last].unsqueeze(2), key], dim=2)
    values = torch.cat([value[rows, :, last].unsqueeze(2), value], dim=2)
    groups = heads // key.shape[1]
    keys = keys.repeat_interleave(groups, dim=1)
    values = values.repeat_interleave(groups, dim=1)
    mask = additive_mask(attention_mask, query).expand(batch, 1, length, length)
    prefix = torch.full((batch, 1, length, 1), rerouting.bias, dtype=query.dtype, device=query.device)
    mask = torch.cat([prefix, mask], dim=-1)
    if softcap is None:
        output = torch.nn.functional.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=scaling
        )
    else:
        scores = torch.tanh(query @ keys.transpose(2, 3) * scaling / softcap) * softcap + mask
        output = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype) @ values
    return output.transpose(1, 2).contiguous()


@contextlib.contextmanager
def reroute(
    runtime: ModelRuntime, layers: Sequence[int], bias: float, last_positions: torch.Tensor
) -> Iterator[None]:
    """Re-route at ``layers`` for the forward passes run inside this block, then restore the model."""
    config = runtime.model.config
    original = config._attn_implementation
    base = original or "eager"
    if base not in BASE_IMPLEMENTATIONS:
        raise RagidxError(
            f"kv-embedding needs the model's attention to be sdpa or eager, not '{base}' "
            "(FlashAttention cannot take the prefix bias)"
        )
    modules = [runtime.arch.attention(layer) for layer in layers]
    config._attn_implementation = _register(base)
    try:
        for module in modules:
            setattr(module, REROUTING_ATTRIBUTE, Rerouting(bias, last_positions))
        yield
    finally:
        for module in modules:
            if hasattr(module, REROUTING_ATTRIBUTE):
                delattr(module, REROUTING_ATTRIBUTE)
        config._attn_implementation = original
