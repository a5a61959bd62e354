"""Load a Hugging Face model once and run batch-invariant forward passes with early exit.

Every strategy goes through this module, so the rules of methods.md §0 (positions from the
attention mask, last *real* token, stop after the last layer a strategy reads) live here once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.choices import DTYPES, resolve_device
from ragidx.indexer.model.embedding_card import EmbeddingCard, folder_card, gguf_card
from ragidx.indexer.model.gguf import is_converted
from ragidx.indexer.model.half_weights import can_hold_half_weights, hold_half
from ragidx.indexer.model.held_weights import hold_linear_weights
from ragidx.indexer.model.int8_products import can_multiply_integers, hold_integer_products
from ragidx.indexer.model.int8_weights import hold_int8
from ragidx.indexer.model.integer_admission import auto_integer_products
from ragidx.indexer.model.memory import LEANEST, auto_dtype, check_fits, folder_parameters
from ragidx.indexer.model.packed_linear import pack_linear_weights
from ragidx.indexer.model.precision import cpu_auto_dtype, integer_speedup, packs_float32
from ragidx.indexer.model.quiet import quiet_transformers
from ragidx.indexer.model.sources import ModelSource, resolve_model
from ragidx.indexer.model.tokenizer_cache import load_tokenizer

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel

DECODER_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3_text")
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta")


@dataclass(frozen=True)
class ArchitectureView:
    """The parts of a model the strategies touch, named the same way for every family."""

    model_type: str
    is_decoder: bool
    layers: Sequence[nn.Module]
    final_norm: nn.Module | None
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def attention(self, layer: int) -> nn.Module:
        """The self-attention module of a decoder layer (its q/k/v/o projections hang off it)."""
        return cast("nn.Module", self.layers[layer].self_attn)

    def attention_output_norm(self, layer: int) -> nn.Module | None:
        """The norm a layer applies to its attention output before adding it to the residual
        stream: Gemma 2 and 3 have one (``post_attention_layernorm``); in Llama, Mistral and Qwen a
        module of that name normalises the residual before the MLP instead, so they have none."""
        norm = self.layers[layer].post_attention_layernorm if self.model_type in GEMMA_TYPES else None
        return cast("nn.Module | None", norm)


def architecture_view(model: Any) -> ArchitectureView:
    """Describe a loaded base model (``AutoModel``), or refuse an architecture ragidx does not know.
    ``model`` is any of the families' classes, whose parts have different names (hence ``Any``)."""
    config = model.config
    model_type = config.model_type
    if model_type in DECODER_TYPES:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return ArchitectureView(
            model_type=model_type,
            is_decoder=True,
            layers=model.layers,
            final_norm=model.norm,
            hidden_size=config.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
        )
    if model_type in ENCODER_TYPES:
        heads = config.num_attention_heads
        return ArchitectureView(
            model_type=model_type,
            is_decoder=False,
            layers=model.encoder.layer,
            final_norm=None,
            hidden_size=config.hidden_size,
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=config.hidden_size // heads,
        )
    raise unsupported_architecture(model_type)


def unsupported_architecture(model_type: str) -> RagidxError:
    return RagidxError(
        f"unsupported architecture '{model_type}': ragidx supports the decoders "
        f"{', '.join(DECODER_TYPES)} and the encoders {', '.join(ENCODER_TYPES)}"
    )


@dataclass
class Batch:
    """Right-padded token ids of some rows of the caller's list, in the order ``indices`` gives."""

    indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    @classmethod
    def single(cls, input_ids: torch.Tensor) -> Batch:
        """The batch of one unpadded row of ids, shape [1, tokens]."""
        import torch

        return cls([0], input_ids, torch.ones_like(input_ids))

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(dim=1)

    @property
    def last_positions(self) -> torch.Tensor:
        """Index of each row's last real token, whichever side the padding is on."""
        import torch

        columns = torch.arange(self.attention_mask.shape[1], device=self.attention_mask.device)
        return (self.attention_mask * columns).argmax(dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """Positions counted over real tokens only, so padding never shifts a row's positions."""
        return (self.attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def plan_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Group row indices longest first so that rows x longest length stays under ``max_tokens``.

    Sorting by length keeps padding small; a single row longer than the budget still forms a
    batch of its own rather than being dropped.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for index in order:
        widest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) >= max_rows or widest * (len(current) + 1) > max_tokens):
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


class _StopForward(Exception):
    """Raised from a hook to leave the forward pass once the last needed layer has run."""


class ModelRuntime:
    """A loaded model and tokenizer with the forward-pass rules every strategy relies on."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        model_id: str,
        revision: str | None = None,
        folder: str | None = None,
        model_file: dict[str, Any] | None = None,
        precision: str | None = None,
        precision_reason: str = "",
        card: EmbeddingCard | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.revision = revision
        self.folder = folder  # the local folder the weights were read from (None: the hub cache)
        self.model_file = model_file  # a GGUF model's path(s) and SHA-256, stored in the index
        # what the weights are held in, as --dtype names it (int8: int8 weights, float32 products;
        # w8a8: int8 x int8 products)
        self.precision = precision or str(next(model.parameters()).dtype).removeprefix("torch.")
        # why --dtype auto chose as it did where speed alone did not decide ("" where it did)
        self.precision_reason = precision_reason
        self.card = card  # how the model's own files say it is read, where it was trained as an embedder
        self.arch = architecture_view(model)
        self.layers_run = 0
        self.layers_available = 0
        self.padded_tokens = 0  # cells of every batch padded so far, real tokens and padding (benchmarks)
        # One caller at a time: strategies hook the model (and re-route its attention) for the
        # length of their forward passes, so two threads' forwards would mix.
        self.in_use = threading.RLock()
        for layer in self.arch.layers:
            layer.register_forward_pre_hook(self._count_layer)

    def _count_layer(self, module: nn.Module, args: Any) -> None:
        self.layers_run += 1

    @property
    def fraction_of_layers_run(self) -> float:
        """Layers executed over layers a full pass would run, since loading (for benchmarks)."""
        return self.layers_run / self.layers_available if self.layers_available else 0.0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in (float32 where the weights are held int8, or float16 on a CPU)."""
        import torch

        if weight_holder(self.precision, self.device.type) is not None:
            return torch.float32
        return next(self.model.parameters()).dtype

    @property
    def max_positions(self) -> int:
        """The longest sequence the model was built for."""
        config = self.model.config
        return int(getattr(config, "max_position_embeddings", None) or 2048)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with the model's own special tokens (BOS, CLS/SEP) as its tokenizer adds them."""
        return list(self.tokenizer(list(texts), add_special_tokens=True)["input_ids"])

    def batches(self, sequences: Sequence[Sequence[int]], max_rows: int, max_tokens: int) -> Iterator[Batch]:
        """Yield right-padded batches of ``sequences`` on the model's device, longest first."""
        for group in plan_batches([len(s) for s in sequences], max_rows, max_tokens):
            yield self.pad([sequences[i] for i in group], group)

    def pad(
        self, sequences: Sequence[Sequence[int]], indices: list[int], padding_side: str = "right"
    ) -> Batch:
        """One padded batch of exactly these sequences (``indices`` says whose they are).

        Strategies pool by position lists that assume right padding; ``left`` exists for the
        strategies that read only the mask and :attr:`Batch.last_positions`, and for their tests.
        """
        import torch

        width = max(len(seq) for seq in sequences)
        ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            columns = slice(width - len(seq), width) if padding_side == "left" else slice(0, len(seq))
            ids[row, columns] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, columns] = 1
        self.padded_tokens += ids.numel()
        return Batch(indices, ids.to(self.device), mask.to(self.device))

    @overload
    def forward(self, batch: Batch) -> torch.Tensor: ...

    @overload
    def forward(self, batch: Batch, stop_after: int) -> torch.Tensor | None: ...

    def forward(self, batch: Batch, stop_after: int | None = None) -> torch.Tensor | None:
        """Run the model on a batch and return the final hidden states (after the final norm).

        With ``stop_after = e`` only ``layers[0..e]`` execute and nothing is returned: callers
        read what they need through hooks registered beforehand (see :meth:`capture`).
        """
        import torch

        last = self.arch.num_layers - 1
        kwargs: dict[str, Any] = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if self.arch.is_decoder:
            kwargs["position_ids"] = batch.position_ids
            kwargs["use_cache"] = False
        self.layers_available += self.arch.num_layers
        with torch.inference_mode():
            if stop_after is None or stop_after >= last:
                return self.model(**kwargs).last_hidden_state
            with self._stop_after(stop_after):
                self.model(**kwargs)
            return None

    @contextlib.contextmanager
    def _stop_after(self, layer: int) -> Iterator[None]:
        def stop(module: nn.Module, args: Any, output: Any) -> None:
            raise _StopForward

        handle = self.arch.layers[layer].register_forward_hook(stop)
        try:
            yield
        except _StopForward:
            pass
        finally:
            handle.remove()

    @contextlib.contextmanager
    def capture(
        self,
        module: nn.Module,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        inputs: bool = False,
    ) -> Iterator[list[torch.Tensor]]:
        """Collect ``module``'s output (its first input with ``inputs=True``) on every call.

        ``reduce`` runs inside the hook, so only what a strategy keeps (a row per text, say) is
        held in memory rather than every layer's full [batch, tokens, dim] tensor.
        """
        outputs: list[torch.Tensor] = []

        def keep(tensor: torch.Tensor) -> None:
            outputs.append(reduce(tensor) if reduce else tensor)

        if inputs:
            handle = module.register_forward_pre_hook(lambda mod, args: keep(args[0]))
        else:
            handle = module.register_forward_hook(
                lambda mod, args, output: keep(output[0] if isinstance(output, tuple) else output)
            )
        try:
            yield outputs
        finally:
            handle.remove()


def resolve_dtype(dtype: str, device: str, config: Any = None) -> str:
    """``auto`` is bfloat16 on CUDA, float16 on MPS, and on a CPU what is measured best there for
    a model of ``config``'s shape (:mod:`ragidx.indexer.model.precision`: bf16 where it is faster,
    else float32; memory may then ask for less). Every strategy runs in it:
    where bf16 moves vectors most (``kv-embedding``, ``cp``), STS-B and SciFact figures held within
    noise of float32 (docs/precision.md)."""
    if dtype not in DTYPES:
        raise RagidxError(f"unknown dtype '{dtype}': choose one of {', '.join(DTYPES)}")
    if dtype == "w8a8" and (device != "cpu" or not can_multiply_integers()):
        raise RagidxError("--dtype w8a8 runs on an x86 CPU only (fbgemm's integer products)")
    if dtype != "auto":
        return dtype
    if device != "cpu":
        return {"cuda": "bfloat16", "mps": "float16"}[device]
    if config is None:
        return "float32"
    return cpu_auto_dtype(*_product_shape(config))


def _product_shape(config: Any) -> tuple[int, int]:
    """A model's widest product, hidden -> intermediate: what the precision probe times."""
    hidden = int(config.hidden_size)
    return hidden, int(getattr(config, "intermediate_size", None) or 4 * hidden)


def weight_holder(run_dtype: str, device: str) -> Callable[[nn.Linear], None] | None:
    """How the linear layers hold their weights where they compute in float32 on leaner ones: int8
    weights anywhere (a GPU takes them where bf16 would not fit), float16 ones on a CPU with fbgemm's
    half-precision product (elsewhere, and on a GPU, float16 computes in float16)."""
    if run_dtype in ("int8", "w8a8"):  # w8a8 is rounded from int8 weights once calibrated
        return hold_int8
    if run_dtype == "float16" and device == "cpu" and can_hold_half_weights():
        return hold_half
    return None


def _load_dtype(run_dtype: str, holder: Callable[[nn.Linear], None] | None, config: Any) -> torch.dtype:
    """The dtype transformers loads the weights in. Held weights are rounded or packed from a 16-bit
    load a layer at a time: int8 from bf16; float16 from the checkpoint's own bf16 where it is
    stored so (a converted GGUF's cache: read in place, every value a float16 one), else float16.
    A load converted whole would hold every weight a second time until the last layer is held
    (a 1B model's float16 run peaked at 4.6 GB, not 2.9)."""
    import torch

    bfloat16_cache = getattr(config, "dtype", None) == torch.bfloat16
    if run_dtype in ("int8", "w8a8") or (holder is hold_half and bfloat16_cache):
        return torch.bfloat16
    return getattr(torch, run_dtype)


def _packs_weights(run_dtype: str, device: str, config: Any) -> bool:
    """bf16 weights are packed on a CPU always (where oneDNN can), float32 ones where measured
    faster; int8 and 16-bit floats keep their own products."""
    if device != "cpu":
        return False
    return run_dtype == "bfloat16" or (run_dtype == "float32" and packs_float32(*_product_shape(config)))


def _not_found(model: str, reason: str) -> RagidxError:
    return RagidxError(
        f"model '{model}' could not be loaded ({reason}); without hub access, pass a model folder or a "
        ".gguf file (--model /path/to/model), or a packaged model such as smollm2 (see ragidx models)"
    )


def _load_config(location: str, model: str, trust_remote_code: bool) -> Any:
    """Read a model's config from a local folder, the hub cache, or the hub (in that order)."""
    from transformers import AutoConfig

    quiet_transformers()
    try:
        return AutoConfig.from_pretrained(
            location, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as cached_error:
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
            raise _not_found(model, "not in the local cache and HF_HUB_OFFLINE is set") from cached_error
    try:
        return AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise _not_found(model, str(error).splitlines()[0]) from error


@functools.lru_cache(maxsize=4)
def model_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (a short name, GGUF file, folder or hub id) alone, without its
    weights: what counts a prompt's tokens for that model. Kept for the next call."""
    location = resolve_model(model).loadable()
    try:
        return load_tokenizer(location)
    except OSError as error:
        raise _not_found(model, str(error).splitlines()[0]) from error


def load_runtime(
    model: str | ModelSource,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    strategy: str | None = None,
) -> ModelRuntime:
    """Load tokenizer and base model (no LM head) by short name, GGUF file, local folder or hub id,
    in the dtype the run uses (a 16-bit cache is upcast at load for float32; for int8, loaded 16-bit
    and rounded a layer at a time), after checking that it fits (:mod:`ragidx.indexer.model.memory`:
    ``auto`` falls back to a leaner dtype that fits rather than refusing). ``strategy`` is the one the
    runtime embeds with, which decides whether ``auto`` takes integer products
    (:mod:`ragidx.indexer.model.integer_admission`); None or "" (generation, several strategies, or
    the model's default, not known before it loads): float products."""
    from transformers import AutoModel

    source = model if isinstance(model, ModelSource) else resolve_model(model)
    model = source.model_id
    device = resolve_device(device)
    if source.gguf and source.gguf.header and not is_converted(source.gguf):
        # before a conversion that could take minutes: would even the leanest run fit?
        check_fits(model, source.gguf.header.parameters, LEANEST, device)
    location = source.loadable()
    config = _load_config(location, model, trust_remote_code)
    if config.model_type not in DECODER_TYPES + ENCODER_TYPES:
        raise unsupported_architecture(config.model_type)
    run_dtype = resolve_dtype(dtype, device, config)
    parameters = folder_parameters(Path(location)) if Path(location).is_dir() else None
    reason = ""
    if parameters is not None:
        if dtype == "auto":
            run_dtype, reason = auto_dtype(parameters, run_dtype, device, config)
        check_fits(model, parameters, run_dtype, device, config)
    card = _card(source)
    if dtype == "auto" and device == "cpu" and strategy and config.model_type in DECODER_TYPES:
        speedup = integer_speedup(*_product_shape(config))
        run_dtype, reason = auto_integer_products(run_dtype, reason, strategy, speedup)
    holder = weight_holder(run_dtype, device)
    torch_dtype = _load_dtype(run_dtype, holder, config)
    try:
        tokenizer = load_tokenizer(location, trust_remote_code)
        network_model = AutoModel.from_pretrained(
            location, config=config, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    except OSError as error:
        raise _not_found(model, str(error).splitlines()[0]) from error
    if not getattr(tokenizer, "is_fast", False):
        raise RagidxError(
            f"model '{model}' has no fast tokenizer (tokenizer.json); ragidx needs one for offsets"
        )
    if tokenizer.pad_token_id is None:
        # Padding is always masked out, so any id will do; EOS is what decoders usually lack a pad for.
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    network_model.eval().requires_grad_(False)
    if holder is not None:
        hold_linear_weights(network_model, holder)  # rounded or packed where the weights were read
    if run_dtype == "w8a8":
        hold_integer_products(network_model, tokenizer)
    network_model.to(device)
    if _packs_weights(run_dtype, device, config):
        pack_linear_weights(network_model)
    local = location if Path(location).is_dir() else None
    model_file = source.gguf.record() if source.gguf else None
    revision = getattr(config, "_commit_hash", None)
    return ModelRuntime(
        network_model,
        tokenizer,
        source.model_id,
        revision,
        local,
        model_file,
        run_dtype,
        reason,
        card=card,
    )


def _card(source: ModelSource) -> EmbeddingCard | None:
    """The embedding card of a GGUF file (its header) or a local sentence-transformers folder."""
    if source.gguf is not None:
        return gguf_card(source.gguf.header.pooling) if source.gguf.header else None
    folder = Path(str(source.location)).expanduser()
    return folder_card(folder) if folder.is_dir() else None
