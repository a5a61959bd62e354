"""Small random models of the real architectures, saved the way a user's model folder looks.

A byte-level BPE tokenizer is trained on the sample corpus; each model is built from its real
config class, saved with ``save_pretrained`` and later loaded through ragidx's own loader.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE_CORPUS = Path(__file__).resolve().parents[2] / "sample_corpus"
DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
ENCODER = "bert"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)


def train_tokenizer(vocab_size: int = 1000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [p.read_text(encoding="utf-8") for p in sorted(SAMPLE_CORPUS.rglob("*")) if p.is_file()]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _wrap(tokenizer, template: str | None, max_length: int):
    """A transformers fast tokenizer that adds the special tokens ``template`` names around the text."""
    import copy

    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = copy.deepcopy(tokenizer)
    steps = [processors.ByteLevel(trim_offsets=True)]
    if template:
        steps.append(
            processors.TemplateProcessing(single=template, special_tokens=[("<s>", BOS), ("</s>", EOS)])
        )
    tokenizer.post_processor = processors.Sequence(steps)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def _config(arch: str, vocab_size: int, overrides: dict | None = None):
    from transformers import (
        BertConfig,
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    common.update(overrides or {})
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "mistral":
        return MistralConfig(**common, sliding_window=4096)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    if arch == "gemma2":
        return Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16, sliding_window=32)
    if arch == "gemma3_text":
        # Interleaved sliding/global layers with their own RoPE bases, q/k norms, and a
        # query_pre_attn_scalar that differs from head_dim, so a formula that confuses them fails.
        return Gemma3TextConfig(
            **common,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=32,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
        )
    if arch == ENCODER:
        return BertConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            max_position_embeddings=512,
            pad_token_id=PAD,
        )
    raise ValueError(arch)


def save_tiny_model(
    arch: str,
    folder: Path,
    tokenizer=None,
    seed: int = 0,
    extra_rows: int = 0,
    overrides: dict | None = None,
) -> Path:
    """Build a random ``arch`` model with its tokenizer and save both to ``folder``.

    ``extra_rows`` gives the embedding matrix spare rows beyond the tokenizer, as Qwen checkpoints
    have; ``overrides`` changes config fields (``num_key_value_heads=4`` makes plain multi-head attention).
    """
    import torch
    from transformers import AutoModelForCausalLM, BertModel

    tokenizer = tokenizer or train_tokenizer()
    config = _config(arch, tokenizer.get_vocab_size() + extra_rows, overrides)
    torch.manual_seed(seed)
    if arch == ENCODER:
        model = BertModel(config)
        wrapped = _wrap(tokenizer, "<s> $A </s>", 512)
    else:
        model = AutoModelForCausalLM.from_config(config)
        wrapped = _wrap(tokenizer, None if arch.startswith("qwen") else "<s> $A", 4096)
    model.save_pretrained(folder)
    wrapped.save_pretrained(folder)
    return folder
