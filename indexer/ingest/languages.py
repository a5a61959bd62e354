"""Which language a text is in, and what keyword search needs of each: its Snowball stemmer and
its stop words.

Languages are ISO 639-1 codes, as py3langid (a maintained fork of langid.py, whose model ships in
the wheel: nothing is downloaded) names them. Stop words are spaCy's lists, read from each list's
own file: importing them the usual way imports spaCy (0.75 s), which a keyword query has no other
use for.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from py3langid.langid import LanguageIdentifier

ENGLISH = "en"
ENGLISH_STEMMER = "porter"
# Languages written without spaces between words: keyword search reads them as character bigrams.
UNSPACED = frozenset({"zh", "ja", "ko"})
# Snowball's algorithm for each language it stems; "porter" for English, the stemmer FTS5's porter
# tokenizer uses, so English keyword search matches what it did before languages were told apart.
STEMMERS = {
    "ar": "arabic",
    "ca": "catalan",
    "cs": "czech",
    "da": "danish",
    "de": "german",
    "el": "greek",
    "en": ENGLISH_STEMMER,
    "eo": "esperanto",
    "es": "spanish",
    "et": "estonian",
    "eu": "basque",
    "fa": "persian",
    "fi": "finnish",
    "fr": "french",
    "ga": "irish",
    "hi": "hindi",
    "hu": "hungarian",
    "hy": "armenian",
    "id": "indonesian",
    "it": "italian",
    "lt": "lithuanian",
    "nb": "norwegian",
    "ne": "nepali",
    "nl": "dutch",
    "no": "norwegian",
    "pl": "polish",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sr": "serbian",
    "sv": "swedish",
    "ta": "tamil",
    "tr": "turkish",
    "yi": "yiddish",
}
# What a document may be told to be in: the languages keyword search has a stemmer or a way of
# reading for, and a few more written in their own scripts; py3langid's model also knows dialects
# and regional languages (Wu Chinese, Venetian, Aragonese) that short or technical text is
# mistaken for.
DOCUMENT_LANGUAGES = frozenset(
    {
        *STEMMERS,
        *UNSPACED,
        "bg",
        "bn",
        "he",
        "hr",
        "is",
        "ka",
        "lv",
        "mk",
        "ms",
        "sk",
        "sl",
        "th",
        "uk",
        "ur",
        "vi",
    }
)
# Enough text to tell a language by: a document's first characters, not all of a long one.
DETECTED_CHARS = 4000


@functools.cache
def _identifier() -> LanguageIdentifier:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@functools.cache
def _restricted(languages: tuple[str, ...]) -> LanguageIdentifier:
    """An identifier that only chooses among ``languages`` (a copy: the shared one stays whole)."""
    identifier = copy.copy(_identifier())
    identifier.set_languages(list(languages))
    return identifier


def detect(text: str, among: Iterable[str] | Mapping[str, int] = DOCUMENT_LANGUAGES) -> str:
    """The likeliest language of ``text`` among ``among`` (a query's among its index's: a short
    query is told far better from a few languages than from all). A mapping weighs each language
    by its count (an index's chunks in it): the detector's probabilities times those shares, so a
    stray chunk told Catalan in a Spanish index does not turn Spanish questions Catalan, while an
    English question in a mostly German index stays English."""
    if len(set(among)) <= 1:  # an index in one language: nothing to tell, and no model to load
        return next(iter(among), ENGLISH)
    known = set(_identifier().nb_classes)
    choices = tuple(sorted(set(among) & known)) or (ENGLISH,)
    if len(choices) == 1:
        return choices[0]
    ranked = _restricted(choices).rank(text[:DETECTED_CHARS])
    if not isinstance(among, Mapping):
        return str(ranked[0][0])
    return str(max(ranked, key=lambda pair: (float(pair[1]) * among[pair[0]], pair[0]))[0])


@functools.cache
def stemmer_name(language: str) -> str:
    """Snowball's algorithm for ``language``; English's for a language Snowball does not stem
    (the Latin words of a Chinese or Japanese text are most often English ones)."""
    import snowballstemmer

    name = STEMMERS.get(language, STEMMERS[ENGLISH])
    return name if name in snowballstemmer.algorithms() else STEMMERS[ENGLISH]


@functools.cache
def stemmer(language: str) -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer(stemmer_name(language))


@functools.cache
def stop_words(language: str = ENGLISH) -> frozenset[str]:
    """spaCy's stop words for ``language`` (none where spaCy has no list)."""
    spec = importlib.util.find_spec("spacy")
    folders = list(spec.submodule_search_locations or []) if spec else []
    source = Path(folders[0]) / "lang" / language / "stop_words.py" if folders else None
    if source is None or not source.is_file():
        return frozenset()
    loader = importlib.util.spec_from_file_location(f"ragidx_stop_words_{language}", source)
    if loader is None or loader.loader is None:
        return frozenset()
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return frozenset(word.lower() for word in module.STOP_WORDS)
