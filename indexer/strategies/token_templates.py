"""Templates as token ids, for strategies that must know exactly which positions hold the text.

Tokenising the template's literal pieces and the text separately (instead of the rendered
string) keeps text tokens from merging with template tokens, so "the text's own tokens" is a
well-defined set of positions (token prepending places placeholders there; echo pools the
second copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragidx.indexer.strategies.base import TEXT_SLOT


@dataclass(frozen=True)
class TokenTemplate:
    """``lead`` + pieces[0] + text + pieces[1] + ... + text + pieces[-1] + ``trail``.

    ``lead`` and ``trail`` are the special tokens the tokenizer adds itself (BOS, sometimes EOS).
    """

    lead: list[int]
    pieces: list[list[int]]
    trail: list[int]

    @property
    def prefix(self) -> list[int]:
        return self.pieces[0]

    @property
    def suffix(self) -> list[int]:
        return self.pieces[-1]

    @property
    def overhead(self) -> int:
        """Tokens the template adds around the text copies."""
        return len(self.lead) + sum(len(piece) for piece in self.pieces) + len(self.trail)


def tokenize_template(tokenizer: Any, template: str) -> TokenTemplate:
    """Split ``template`` at its ``{text}`` slots; BOS/EOS come from what the tokenizer adds to a probe."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x")["input_ids"]
    start = next(i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain)
    pieces = [
        list(tokenizer(piece, add_special_tokens=False)["input_ids"]) if piece else []
        for piece in template.split(TEXT_SLOT)
    ]
    return TokenTemplate(full[:start], pieces, full[start + len(plain) :])
