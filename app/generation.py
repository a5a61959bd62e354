"""Models that write answers: a chat model ragidx loads itself, or any OpenAI-compatible chat
endpoint (Ollama, llama.cpp's server, vLLM, OpenAI).

A local generator is the loaded base model (the one an index embeds with, when that is an
instruct model: no second copy in memory) under its causal-LM head: the head shares the
embedding matrix where the model ties them, as SmolLM2, Gemma and most small instruct models do.
Answers are greedy (the same question gives the same answer) and streamed piece by piece.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from ragidx.app.answering import Answer
from ragidx.indexer.errors import Cancelled, RagidxError
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime, weight_holder
from ragidx.indexer.search.context import Context

Message = dict[str, str]
API_KEY_VARIABLES = ("RAGIDX_LLM_API_KEY", "OPENAI_API_KEY")  # the endpoint's key, first one set
ENDPOINT_SECONDS = 300.0  # for an endpoint to send the next piece of its answer
MAX_LINE_BYTES = 1 << 20  # one server-sent event line
MAX_ANSWER_BYTES_PER_TOKEN = 64  # an answer's bytes, per token asked for
CANCEL_POLL_SECONDS = 0.2  # a cancelled or overdue chat request is closed within this
MIN_LOOP_TOKENS = 8  # the shortest run of tokens whose repeats stop a local answer (see looping)
MAX_LOOP_TOKENS = 128  # the longest (a sentence or two)
LOOP_REPEATS = 3


@dataclass
class Generated:
    """What a generator wrote, how long it took, and how it ended (:data:`STATUSES`)."""

    text: str
    new_tokens: int
    first_token_seconds: float | None
    seconds: float
    status: str = "complete"

    def answer(
        self, question: str, model: str, context: Context | None, prepare_seconds: float = 0.0
    ) -> Answer:
        """The answer this text gives to ``question`` from ``context``, with what it cites;
        ``prepare_seconds``: what came before the writing (loading, search, context)."""
        return Answer.of(
            question,
            self.text,
            model,
            context,
            status=self.status,
            new_tokens=self.new_tokens,
            first_token_seconds=self.first_token_seconds,
            seconds=self.seconds,
            prepare_seconds=prepare_seconds,
        )


def ended(text: str, finished: bool, capped: bool, repeated: bool = False) -> str:
    """An answer's status: ``complete`` (its model ended it), ``length`` (cut at the tokens asked
    for), ``repetition`` (stopped because it went round in a loop), ``truncated`` (its stream
    stopped before its end) or ``empty`` (no text)."""
    if repeated:
        return "repetition"
    if capped:
        return "length"
    if not finished:
        return "truncated"
    return "complete" if text.strip() else "empty"


class Generator(Protocol):
    name: str

    def generate(
        self,
        messages: Sequence[Message],
        max_new_tokens: int,
        on_text: Callable[[str], None],
        cancel: threading.Event | None = None,
    ) -> Generated:
        """Answer ``messages``, passing each new piece of text to ``on_text`` as it comes; stop
        early once ``cancel`` is set."""
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
        if not runtime.arch.is_decoder:
            raise RagidxError(
                f"model '{runtime.model_id}' is a {runtime.arch.model_type} encoder, not a decoder-only LLM: "
                "it cannot answer or rerank (name one such as smollm2 or gemma3-270m)"
            )
        self.runtime = runtime
        self.name = runtime.model_id
        self.model = causal_lm(runtime)

    @functools.cached_property
    def template(self) -> str:
        """The chat template answers are written in (reranking needs none: a base model reranks)."""
        return chat_template(self.runtime)

    @classmethod
    def load(cls, model: str, device: str = "auto", dtype: str = "auto") -> LocalGenerator:
        return cls(load_runtime(model, device, dtype))

    def generate(
        self,
        messages: Sequence[Message],
        max_new_tokens: int,
        on_text: Callable[[str], None],
        cancel: threading.Event | None = None,
    ) -> Generated:
        decoding = self.start(messages, max_new_tokens)
        while (piece := decoding.step()) is not None:
            if cancel is not None and cancel.is_set():
                break
            if piece:
                on_text(piece)
        return decoding.result()

    def start(self, messages: Sequence[Message], max_new_tokens: int) -> Decoding:
        """An answer to be written a token at a time (see :class:`Decoding`)."""
        return Decoding(self, messages, max_new_tokens)


@functools.cache
def cache_field() -> str:
    """The key-value cache's argument and output field: ``cache`` in transformers 5.24 and later,
    ``past_key_values`` before (and deprecated since)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class Decoding:
    """An answer written greedily, one token per :meth:`step`: each step is one forward pass over
    one new token (the prompt's in the first), short enough to be a slice of the scheduler's
    (:mod:`ragidx.app.service.scheduler`), which runs other clients' work between them. The key-value
    cache is this answer's own."""

    def __init__(self, generator: LocalGenerator, messages: Sequence[Message], max_new_tokens: int):
        tokenizer = generator.runtime.tokenizer
        prompt = tokenizer.apply_chat_template(
            list(messages), chat_template=generator.template, add_generation_prompt=True, tokenize=False
        )
        self.pending = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(
            generator.runtime.device
        )
        self.model = generator.model
        self.tokenizer = tokenizer
        self.stops = set(stop_ids(tokenizer))
        self.max_new_tokens = max_new_tokens
        self.tokens: list[int] = []
        self.cache: Any = None
        self.shown = ""  # the text handed out so far
        self.finished = False
        self.repeated = False
        self.started = time.perf_counter()
        self.first: float | None = None

    def step(self) -> str | None:
        """Write the next token: the text it completes ('' while a character is unfinished), or
        None once the answer is finished (an end token, or ``max_new_tokens`` written)."""
        import torch

        if self.finished:
            return None
        field = cache_field()
        with torch.inference_mode():
            out = self.model(input_ids=self.pending, use_cache=True, logits_to_keep=1, **{field: self.cache})
        self.cache = getattr(out, field)
        token = int(out.logits[0, -1].argmax())
        if token in self.stops:
            self.finished = True
            return self._rest()
        self.tokens.append(token)
        self.pending = torch.tensor([[token]], device=self.pending.device)
        self.repeated = looping(self.tokens)
        self.finished = self.repeated or len(self.tokens) >= self.max_new_tokens
        return self._rest()

    def _rest(self) -> str:
        """The decoded text not handed out yet, held back while it ends in half a character."""
        text = self.text()
        if text.endswith("\ufffd") and not self.finished:
            return ""
        piece = text[len(self.shown) :] if text.startswith(self.shown) else ""
        self.shown = text if text.startswith(self.shown) else self.shown
        if piece and self.first is None:
            self.first = time.perf_counter() - self.started
        return piece

    def text(self) -> str:
        return str(
            self.tokenizer.decode(self.tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        )

    def result(self) -> Generated:
        capped = len(self.tokens) >= self.max_new_tokens
        status = ended(self.shown, self.finished, capped, self.repeated)
        return Generated(self.shown, len(self.tokens), self.first, time.perf_counter() - self.started, status)


def looping(tokens: Sequence[int]) -> bool:
    """Whether an answer ends in the same run of :data:`MIN_LOOP_TOKENS` to
    :data:`MAX_LOOP_TOKENS` tokens written :data:`LOOP_REPEATS` times over: a small model's greedy
    decoding, once in such a loop, stays in it to the token limit (SmolLM2 did, in 4 of 4 answers
    about package READMEs)."""
    for size in range(MIN_LOOP_TOKENS, min(MAX_LOOP_TOKENS, len(tokens) // LOOP_REPEATS) + 1):
        last = tokens[-size:]
        if all(tokens[-size * (n + 1) : len(tokens) - size * n] == last for n in range(1, LOOP_REPEATS)):
            return True
    return False


def stop_ids(tokenizer: Any) -> list[int]:
    """The tokens that end an answer: the end-of-sequence token and the chat format's end of turn."""
    found = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
        found.add(tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None)
    return sorted(i for i in found if isinstance(i, int) and i >= 0)


def causal_lm(runtime: ModelRuntime) -> Any:
    """The runtime's base model under its architecture's causal-LM class, sharing its weights:
    the head is the embedding matrix where the model ties them (nothing is copied, but for weights
    held int8 or float16: a copy held so); a model with a separate head needs it in its folder."""
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
    holder = weight_holder(runtime.precision, runtime.device.type)
    if holder is not None:
        holder(head)  # its own int8 or float16 copy: the embedding it may share stays as it is
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


class EndpointError(RagidxError):
    """The chat endpoint failed or answered something that is not a chat completion (a server
    answers 502 for it: the fault is upstream, not in the request)."""


class ChatEndpoint:
    """An OpenAI-compatible chat completions endpoint, streamed (server-sent events).

    Its answer is read with no model held (a server runs it outside its scheduler) and within
    bounds ragidx keeps itself, whatever the endpoint does: :data:`ENDPOINT_SECONDS` of silence,
    :func:`total_seconds` in all, ``max_new_tokens`` pieces of text (an endpoint may ignore
    ``max_tokens``), :data:`MAX_LINE_BYTES` a line and :data:`MAX_ANSWER_BYTES_PER_TOKEN` bytes
    per token asked for. ``cancel`` (a client that went away) closes the request within
    :data:`CANCEL_POLL_SECONDS`. A redirect is refused, not followed: following it would send the
    key to another host.
    """

    def __init__(self, url: str, model: str | None, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.name = model or "default"
        self.api_key = api_key or next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)

    def generate(
        self,
        messages: Sequence[Message],
        max_new_tokens: int,
        on_text: Callable[[str], None],
        cancel: threading.Event | None = None,
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
        started = time.perf_counter()
        stop = Stop(cancel, total_seconds(max_new_tokens))
        reply = Reply()
        text, first, pieces, capped = "", None, 0, False
        connection = self._connection()
        try:
            stop.watch(connection)
            connection.request("POST", self._path("/chat/completions"), json.dumps(body).encode(), headers)
            response = connection.getresponse()
            self._refuse_status(response)
            for piece in reply.pieces(response, MAX_ANSWER_BYTES_PER_TOKEN * max_new_tokens):
                if not piece:
                    continue
                first = first if first is not None else time.perf_counter() - started
                text += piece
                on_text(piece)
                pieces += 1
                if (
                    pieces >= max_new_tokens
                    or len(text.encode()) > MAX_ANSWER_BYTES_PER_TOKEN * max_new_tokens
                ):
                    capped = True  # an endpoint that ignores max_tokens is held to it here
                    break
        except (OSError, http.client.HTTPException) as error:
            stop.raise_if_stopped(self.url)
            reason = getattr(error, "reason", None) or error
            raise EndpointError(f"cannot reach the chat endpoint {self.url}: {reason}") from None
        finally:
            stop.done()
            connection.close()
        stop.raise_if_stopped(self.url)
        tokens = int(reply.usage.get("completion_tokens") or pieces)
        status = ended(text, reply.ended, capped or reply.finish == "length")
        return Generated(text, tokens, first, time.perf_counter() - started, status)

    def _connection(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RagidxError(f"--llm-url {self.url} is not an http:// or https:// address")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.hostname, parts.port, timeout=ENDPOINT_SECONDS)

    def _path(self, route: str) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return parts.path.rstrip("/") + route + (f"?{parts.query}" if parts.query else "")

    def _refuse_status(self, response: http.client.HTTPResponse) -> None:
        if 300 <= response.status < 400:
            raise EndpointError(
                f"the chat endpoint {self.url} redirected to {response.getheader('Location', '?')[:200]}: "
                "give --llm-url that address (a redirect is not followed: it would send the key elsewhere)"
            )
        if response.status >= 400:
            raise EndpointError(
                f"the chat endpoint {self.url} answered {response.status}: {_reason(response)}"
            )


class Stop:
    """Ends a chat request when its client goes away (``cancel``) or its time is up: a watcher
    thread shuts its socket down, which ends a read blocked on it at once."""

    def __init__(self, cancel: threading.Event | None, seconds: float):
        self.cancel = cancel or threading.Event()
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.finished = threading.Event()
        self.why: str | None = None

    def watch(self, connection: http.client.HTTPConnection) -> None:
        connection.connect()
        sock = connection.sock

        def watcher() -> None:
            while not self.finished.wait(CANCEL_POLL_SECONDS):
                if self.cancel.is_set() or time.monotonic() >= self.deadline:
                    self.why = "cancelled" if self.cancel.is_set() else "deadline"
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    return

        threading.Thread(target=watcher, name="ragidx-chat-watch", daemon=True).start()

    def done(self) -> None:
        self.finished.set()

    def raise_if_stopped(self, url: str) -> None:
        if self.why == "cancelled" or self.cancel.is_set():
            raise Cancelled
        if self.why == "deadline":
            raise EndpointError(f"the chat endpoint {url} did not finish its answer in {self.seconds:g} s")


def total_seconds(max_new_tokens: int) -> float:
    """The longest a chat request may take: ``$RAGIDX_LLM_SECONDS``, else a minute plus a second
    per token asked for (a slow CPU server writes a few tokens a second)."""
    given = os.environ.get("RAGIDX_LLM_SECONDS", "").strip()
    try:
        seconds = float(given) if given else 60.0 + max_new_tokens
    except ValueError:
        raise RagidxError(f"RAGIDX_LLM_SECONDS={given!r} is not a number of seconds") from None
    if not seconds > 0:
        raise RagidxError(f"RAGIDX_LLM_SECONDS={given!r} is not a number of seconds")
    return seconds


class Reply:
    """Reads a chat completion, streamed (server-sent events) or whole (a server that ignores
    ``stream``), refusing anything of another shape with :class:`EndpointError`; records whether
    it came to its end (``[DONE]``, a finish reason, a whole JSON body), its last finish reason
    and the usage it reported."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None
        self.ended = False

    def pieces(self, response: http.client.HTTPResponse, max_bytes: int) -> Iterator[str]:
        """The answer's text, piece by piece."""
        if response.getheader("Content-Type", "").split(";")[0].strip() == "application/json":
            whole = response.read(max_bytes + MAX_LINE_BYTES)
            yield from self._contents(self._event(whole.decode("utf-8", "replace")), "message")
            self.ended = True
            return
        while raw := response.readline(MAX_LINE_BYTES + 1):
            if len(raw) > MAX_LINE_BYTES:
                raise EndpointError(f"the chat endpoint sent a line longer than {MAX_LINE_BYTES} bytes")
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                self.ended = True
                return
            yield from self._contents(self._event(data), "delta")
        self.ended = self.finish is not None  # no [DONE]: some servers end at a finish reason

    def _event(self, data: str) -> dict[str, Any]:
        try:
            event = json.loads(data)
        except ValueError:
            raise EndpointError(f"the chat endpoint sent something that is not JSON: {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise EndpointError(f"the chat endpoint sent an event that is not an object: {data[:80]!r}")
        if event.get("error"):
            raise EndpointError(f"the chat endpoint failed: {_message(event['error'])}")
        if isinstance(event.get("usage"), dict):
            self.usage.update(event["usage"])
        return event

    def _contents(self, event: dict[str, Any], field: str) -> Iterator[str]:
        """The text of each choice's ``delta`` (a stream) or ``message`` (a whole answer)."""
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
            raise EndpointError(
                f"the chat endpoint sent choices that are not a list of objects: {_cut(event)}"
            )
        for choice in choices:
            part = choice.get(field)
            content = part.get("content") if isinstance(part, dict) else None
            if content is not None and not isinstance(content, str):
                raise EndpointError(f"the chat endpoint sent content that is not text: {_cut(event)}")
            if isinstance(choice.get("finish_reason"), str):
                self.finish = choice["finish_reason"]
            yield content or ""


def _cut(event: Any) -> str:
    return repr(json.dumps(event)[:80])


def _reason(response: http.client.HTTPResponse) -> str:
    try:
        return _message(json.loads(response.read(MAX_LINE_BYTES).decode("utf-8", "replace")).get("error"))
    except (ValueError, AttributeError, OSError):
        return str(response.reason)


def _message(error: Any) -> str:
    return str(error.get("message") if isinstance(error, dict) else error)[:300]
