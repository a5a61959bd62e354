"""Strategy options, declared once: each strategy's ``Options`` dataclass (as simonw/llm's
``Model.Options``) is the only place an option is named, typed, defaulted and explained.

Everything else is derived from those fields: which options a strategy takes (and the refusal of
the ones it does not), the checks on a given value, the stored parameters (a strategy's resolved
options) and the CLI's flags (:func:`option_specs`, one flag per name over every strategy).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ragidx.indexer.errors import RagidxError

OptionKind = type[str] | type[int] | type[float] | type[bool]
QUERY_INSTRUCTION_HELP = "Text placed before each query inside its template."
OptionsT = TypeVar("OptionsT", bound="StrategyOptions")


def option(help: str | None, default: Any = None, *, minimum: int | None = None) -> Any:
    """A field of a strategy's ``Options``: ``help`` becomes the CLI flag's help (``None``: a stored
    parameter only, never a flag); ``minimum`` bounds a whole number."""
    return dataclasses.field(default=default, metadata={"help": help, "minimum": minimum})


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class OptionType:
    """What a field's annotation allows, read once: its scalar kind and, for a Literal, its choices."""

    kind: OptionKind
    choices: tuple[str, ...] = ()

    @classmethod
    def of(cls, annotation: Any) -> OptionType:
        members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
        for member in members:
            if typing.get_origin(member) is Literal:
                return cls(str, tuple(typing.get_args(member)))
        for kind in (bool, int, float):  # bool first: it is also an int
            if kind in members:
                return cls(kind)
        return cls(str)  # text, or text the strategy parses itself (a layer set like 20-27)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


@dataclass(frozen=True)
class StrategyOptions:
    """The options of a strategy beyond what every strategy takes (templates, max length, batch);
    a strategy with options subclasses this with one :func:`option` field per option."""

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def types(cls) -> dict[str, OptionType]:
        hints = typing.get_type_hints(cls)
        return {f.name: OptionType.of(hints[f.name]) for f in dataclasses.fields(cls)}

    @classmethod
    def given(cls: type[OptionsT], values: Mapping[str, Any], strategy: str) -> OptionsT:
        """The options from user-given or stored values, each checked against its declaration;
        a name the strategy does not take is refused, so ``--layers`` with ``mean`` is an error."""
        foreign = sorted(set(values) - cls.names())
        if foreign:
            raise RagidxError(f"{', '.join(map(flag_of, foreign))} does not apply to strategy '{strategy}'")
        types_ = cls.types()
        minimums = {f.name: f.metadata["minimum"] for f in dataclasses.fields(cls)}
        checked = {
            name: _checked(name, value, types_[name], minimums[name])
            for name, value in values.items()
            if value is not None
        }
        return cls(**checked)


def _checked(name: str, value: Any, expected: OptionType, minimum: int | None) -> Any:
    """``value`` as the declared type, or a one-line error naming the flag."""
    flag = flag_of(name)
    if expected.choices:
        if value not in expected.choices:
            choices = ", ".join(expected.choices[:-1]) + " or " + expected.choices[-1]
            raise RagidxError(f"unknown {flag} {value!r}: choose {choices}")
        return value
    kind = expected.kind
    if kind is bool and not isinstance(value, bool):
        raise RagidxError(f"{flag} is true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RagidxError(f"{flag} needs a whole number, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RagidxError(f"{flag} needs a number, got {value!r}")
        return float(value)
    if minimum is not None and value < minimum:
        raise RagidxError(f"{flag} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class OptionSpec:
    """One CLI flag: an option name over every strategy that declares it."""

    name: str
    help: str
    type: OptionType
    minimum: int | None

    @property
    def flag(self) -> str:
        return flag_of(self.name)


def option_specs(strategies: Iterable[tuple[str, type[StrategyOptions]]]) -> list[OptionSpec]:
    """The flags for ``(strategy name, Options)`` pairs, in first-declared order. A name several
    strategies declare becomes one flag: its help lists each distinct declaration with the
    strategies that share it, and it keeps a choice list only where all declare the same one."""
    declared: dict[str, list[tuple[str, dataclasses.Field[Any], OptionType]]] = {}
    for strategy, options in strategies:
        types_ = options.types()
        for f in dataclasses.fields(options):
            if f.metadata["help"] is not None:
                declared.setdefault(f.name, []).append((strategy, f, types_[f.name]))
    specs = []
    for name, declarations in declared.items():
        kinds = {kind for _, _, kind in declarations}
        shared = kinds.pop() if len(kinds) == 1 else OptionType(str)
        minimum = min({f.metadata["minimum"] for _, f, _ in declarations} - {None}, default=None)
        specs.append(
            OptionSpec(name, _merged_help(declarations, list_choices=not shared.choices), shared, minimum)
        )
    return specs


def _merged_help(
    declarations: list[tuple[str, dataclasses.Field[Any], OptionType]], list_choices: bool
) -> str:
    """``"htp, tp: <help> (default mean)."``, one part per distinct help, choices and default;
    ``list_choices`` where the flag itself cannot offer them (its declarations differ)."""
    groups: dict[str, list[str]] = {}
    for strategy, f, declared in declarations:
        notes = ["|".join(declared.choices)] if list_choices and declared.choices else []
        if f.default not in (None, False, dataclasses.MISSING):
            notes.append(f"default {f.default}")
        text = f.metadata["help"].rstrip(".") + (f" ({'; '.join(notes)})" if notes else "") + "."
        groups.setdefault(text, []).append(strategy)
    return " ".join(f"{', '.join(strategies)}: {text}" for text, strategies in groups.items())
