"""An answer from retrieved passages: the prompt that asks a model to cite them, and what the
answer cites.

The context goes to the model as data inside the user's message, under the instruction to answer
from it and cite ``[n]``; nothing in a document is ever read as an instruction to ragidx (the
answer is only printed). Citations are read back from the answer: a number that names a passage
is a source, any other is flagged, never silently printed as one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.context import Context, nothing_fits

INSTRUCTION = (
    "Answer the question using only the numbered passages in the context. After each statement, "
    "cite the passage it comes from as [n]. If the passages do not hold the answer, say so."
)
CLOSED_BOOK = "Answer the question briefly."
CITATION = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")
DEFAULT_NEW_TOKENS = 256
BIGGER_MODEL = (
    "small local models rarely answer usefully: use an instruct model of 1B or more (--llm) "
    "or a chat server (--llm-url)"
)


def messages(question: str, context: Context | None) -> list[dict[str, str]]:
    """The chat that asks for an answer from ``context`` (None: closed-book, the model alone)."""
    if context is None:
        return [{"role": "system", "content": CLOSED_BOOK}, {"role": "user", "content": question}]
    return [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": f"Context:\n\n{context.text}\n\nQuestion: {question}"},
    ]


def refuse_unfitted(context: Context) -> None:
    """Refuse to ask a model with an empty context where the budget left every passage out: it
    would answer from nothing, and nobody would know why."""
    why = nothing_fits(context.to_dict())
    if why:
        raise RagidxError(why)


def cited_numbers(answer: str) -> list[int]:
    """The passage numbers the answer cites (``[2]``, ``[1, 3]``), in order of first citation."""
    found: list[int] = []
    for group in CITATION.findall(answer):
        for number in re.split(r"[,;]", group):
            if int(number) not in found:
                found.append(int(number))
    return found


@dataclass
class Answer:
    """A generated answer with the passages it was given and the ones it cites."""

    question: str
    text: str
    model: str
    context: Context | None
    cited: list[int] = field(default_factory=list)  # numbers of passages the answer cites
    unknown: list[int] = field(default_factory=list)  # numbers it cites that name no passage
    status: str = "complete"  # how it ended: see ragidx.app.generation.ended
    new_tokens: int = 0
    first_token_seconds: float | None = None
    seconds: float = 0.0  # writing the answer
    prepare_seconds: float = 0.0  # before it: the model loaded (or waited for), the search, the context

    @classmethod
    def of(cls, question: str, text: str, model: str, context: Context | None, **timing: Any) -> Answer:
        numbers = cited_numbers(text)
        known = len(context.passages) if context else 0
        cited = [n for n in numbers if 1 <= n <= known]
        unknown = [n for n in numbers if not 1 <= n <= known]
        return cls(question, text, model, context, cited, unknown, **timing)

    def citations(self) -> list[dict[str, Any]]:
        """Each cited passage: its number, path, span, pages and title."""
        passages = self.context.passages if self.context else ()
        return [
            {
                key: value
                for key, value in passages[n - 1].to_dict(n).items()
                if key not in ("text", "chunk_ids")
            }
            for n in self.cited
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.text,
            "status": self.status,
            "model": self.model,
            "citations": self.citations(),
            "unknown_citations": self.unknown,
            "passages": self.context.to_dict()["passages"] if self.context else [],
            "context_tokens": self.context.tokens if self.context else 0,
            "new_tokens": self.new_tokens,
            "first_token_seconds": self.first_token_seconds,
            "seconds": self.seconds,
            "prepare_seconds": self.prepare_seconds,
            "total_seconds": self.prepare_seconds + self.seconds,
        }


def problems(answer: dict[str, Any]) -> tuple[list[str], str | None]:
    """What to tell a reader of ``answer`` (``Answer.to_dict``): warnings, and the error that
    makes it unusable (an empty answer, or one its endpoint cut off), if any."""
    status, model = answer.get("status", "complete"), answer["model"]
    warnings = [f"warning: {flagged(answer['unknown_citations'])}"] if answer["unknown_citations"] else []
    if status == "length":
        limit = f"{answer['new_tokens']} new tokens: --max-new-tokens"
        warnings.append(f"warning: the answer stopped at its token limit ({limit})")
    if status == "repetition":
        warnings.append(f"warning: {model} went round in a loop, so its answer was stopped; {BIGGER_MODEL}")
    if answer["passages"] and not answer["citations"] and status in ("complete", "length"):
        warnings.append(
            f"warning: the answer cites none of the {len(answer['passages'])} passages; check it against them"
        )
    if status == "truncated":
        return (
            warnings,
            "the chat endpoint ended its stream before the end of the answer: the answer above is incomplete",
        )
    if status == "empty":
        return warnings, f"{model} wrote no answer; {BIGGER_MODEL}"
    return warnings, None


def flagged(unknown: Sequence[int]) -> str:
    """The warning for citations that name no passage."""
    shown = ", ".join(f"[{n}]" for n in unknown)
    return f"the answer cites {shown}, which {'is' if len(unknown) == 1 else 'are'} not in the context"
