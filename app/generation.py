"""Models that write answers: a chat model ragidx loads itself, or any OpenAI-compatible chat
endpoint (Ollama, llama.cpp's server, vLLM, OpenAI).

A local generator is the loaded base model (the one an index embeds with, when that is an
instruct model: no second copy in memory) under its causal-LM head: the head shares the
embedding matrix where the model ties them, as SmolLM2, Gemma and most small instruct models do.
Answers are greedy (the same question gives the same answer) and streamed piece by piece.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.int8_weights import hold_int8
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime

Message = dict[str, str]
API_KEY_VARIABLES = ("RAGIDX_LLM_API_KEY", "OPENAI_API_KEY")  # the endpoint's key, first one set
ENDPOINT_SECONDS = 300.0  # for an endpoint to send the next piece of its answer


@dataclass
class Generated:
    """What a generator wrote, and how long it took."""

    text: str
    new_tokens: int
    first_token_seconds: float | None
    seconds: float


class Generator(Protocol):
    name: str

    def generate(
        self, messages: Sequence[Message], max_new_tokens: int, on_text: Callable[[str], None]
    ) -> Generated:
        """Answer ``messages``, passing each new piece of text to ``on_text`` as it comes."""
        ...


def chat_template(runtime: ModelRuntime) -> str:
    """The model's chat template (its tokenizer's, or the file its folder keeps it in); a model
    without one is refused: it was not made to answer, and a prompt for it would be a guess."""
    found = getattr(runtime.tokenizer, "chat_template", None)
    folder = Path(runtime.folder) if runtime.folder else None
    if not found and folder is not None and (folder / "chat_template.jinja").is_file():
        found = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if not found and folder is not None and (folder / "tokenizer_config.json").is_file():
        found = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get(
            "chat_template"
        )
    if not isinstance(found, str) or not found:
        raise RagidxError(
            f"model '{runtime.model_id}' has no chat template, so it cannot answer: give --llm an instruct "
            "model (e.g. smollm2) or --llm-url an OpenAI-compatible chat server"
        )
    return found


class LocalGenerator:
    """A chat model run by ragidx, on the weights of a loaded :class:`ModelRuntime`."""

    def __init__(self, runtime: ModelRuntime):
        self.runtime = runtime
        self.name = runtime.model_id
        self.template = chat_template(runtime)
        self.model = causal_lm(runtime)

    @classmethod
    def load(cls, model: str, device: str = "auto", dtype: str = "auto") -> LocalGenerator:
        return cls(load_runtime(model, device, dtype))

    def generate(
        self, messages: Sequence[Message], max_new_tokens: int, on_text: Callable[[str], None]
    ) -> Generated:
        import torch
        from transformers import TextIteratorStreamer

        tokenizer = self.runtime.tokenizer
        prompt = tokenizer.apply_chat_template(
            list(messages), chat_template=self.template, add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(
            self.runtime.device
        )
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        failed: list[BaseException] = []

        def run() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        streamer=streamer,
                        pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=stop_ids(tokenizer),
                    )
            except BaseException as error:  # re-raised in the caller's thread
                failed.append(error)
                streamer.end()

        started = time.perf_counter()
        worker = threading.Thread(target=run, name="ragidx-generate", daemon=True)
        worker.start()
        text, first = _collect(streamer, on_text, started)
        worker.join()
        if failed:
            raise failed[0]
        new_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0
        return Generated(text, new_tokens, first, time.perf_counter() - started)


def _collect(
    pieces: Iterator[str], on_text: Callable[[str], None], started: float
) -> tuple[str, float | None]:
    """Pass each non-empty piece on as it comes; the whole text and when its first piece came."""
    text, first = "", None
    for piece in pieces:
        if piece:
            first = first if first is not None else time.perf_counter() - started
            text += piece
            on_text(piece)
    return text, first


def stop_ids(tokenizer: Any) -> list[int]:
    """The tokens that end an answer: the end-of-sequence token and the chat format's end of turn."""
    found = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
        found.add(tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None)
    return sorted(i for i in found if isinstance(i, int) and i >= 0)


def causal_lm(runtime: ModelRuntime) -> Any:
    """The runtime's base model under its architecture's causal-LM class, sharing its weights:
    the head is the embedding matrix where the model ties them (nothing is copied, but for int8
    weights: an int8 copy); a model with a separate head needs it in its folder."""
    import torch
    from transformers import AutoModelForCausalLM

    base = runtime.model
    config = base.config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    setattr(model, model.base_model_prefix, base)
    embeddings = cast("torch.nn.Embedding", base.get_input_embeddings())
    rows, width = embeddings.weight.shape
    head = torch.nn.Linear(width, rows, bias=False, device="meta")
    if getattr(config, "tie_word_embeddings", False):
        head.weight = embeddings.weight
    else:
        head.weight = torch.nn.Parameter(_head_weight(runtime).to(embeddings.weight), requires_grad=False)
    model.set_output_embeddings(head)
    if runtime.precision == "int8":
        hold_int8(head)  # its own int8 copy: the embedding it may share stays 16-bit
    if any(parameter.is_meta for parameter in model.parameters()):
        raise RagidxError(
            f"model '{runtime.model_id}' cannot generate: its causal-LM class has weights ragidx lacks"
        )
    return model.eval()


def _head_weight(runtime: ModelRuntime) -> Any:
    """A model's own output head (``lm_head.weight``) from its folder's safetensors."""
    from safetensors import safe_open

    folder = Path(runtime.folder) if runtime.folder else None
    for path in sorted(folder.glob("*.safetensors")) if folder else []:
        with safe_open(str(path), framework="pt") as weights:
            if "lm_head.weight" in weights.keys():  # noqa: SIM118 - safe_open is not a mapping
                return weights.get_tensor("lm_head.weight")
    raise RagidxError(
        f"model '{runtime.model_id}' keeps no output head where ragidx can read it (a GGUF model whose "
        "head is not tied to its embeddings): serve it with llama.cpp or Ollama and give --llm-url"
    )


class ChatEndpoint:
    """An OpenAI-compatible chat completions endpoint, streamed (server-sent events)."""

    def __init__(self, url: str, model: str | None, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.name = model or "default"
        self.api_key = api_key or next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)

    def generate(
        self, messages: Sequence[Message], max_new_tokens: int, on_text: Callable[[str], None]
    ) -> Generated:
        body = {
            "model": self.name,
            "messages": list(messages),
            "max_tokens": max_new_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            f"{self.url}/chat/completions", data=json.dumps(body).encode(), headers=headers
        )
        started = time.perf_counter()
        usage: dict[str, Any] = {}
        try:
            with urllib.request.urlopen(request, timeout=ENDPOINT_SECONDS) as response:
                text, first = _collect(_events(response, usage), on_text, started)
        except urllib.error.HTTPError as error:
            raise RagidxError(
                f"the chat endpoint {self.url} answered {error.code}: {_reason(error)}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", None) or error
            raise RagidxError(f"cannot reach the chat endpoint {self.url}: {reason}") from None
        return Generated(text, int(usage.get("completion_tokens") or 0), first, time.perf_counter() - started)


def _events(response: Any, usage: dict[str, Any]) -> Iterator[str]:
    """The text pieces of a streamed chat completion (``data:`` lines until ``[DONE]``); the usage
    the endpoint reports at the end goes into ``usage``."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise RagidxError(f"the chat endpoint sent something that is not JSON: {data[:80]!r}") from None
        if event.get("error"):
            raise RagidxError(f"the chat endpoint failed: {_message(event['error'])}")
        usage.update(event.get("usage") or {})
        for choice in event.get("choices") or []:
            yield (choice.get("delta") or {}).get("content") or ""


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        return _message(json.loads(error.read().decode("utf-8", "replace")).get("error"))
    except (ValueError, AttributeError):
        return str(error.reason)


def _message(error: Any) -> str:
    return str(error.get("message") if isinstance(error, dict) else error)[:300]
