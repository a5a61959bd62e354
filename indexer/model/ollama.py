"""Ollama's local models by name: ``--model ollama:llama3.2:1b`` finds the GGUF blob Ollama pulled.

Ollama stores models as content-addressed blobs behind OCI-style manifests:
``<models>/manifests/<host>/<namespace>/<name>/<tag>`` is JSON whose layer of media type
``application/vnd.ollama.image.model`` names the GGUF as ``<models>/blobs/sha256-<hex>``. A name is
``[host/][namespace/]name[:tag]`` with host ``registry.ollama.ai``, namespace ``library`` and tag
``latest`` by default; ``<models>`` is ``$OLLAMA_MODELS``, else ``~/.ollama/models``, else the
Linux service's ``/usr/share/ollama/.ollama/models``. Nothing here talks to Ollama's server: the
files are read directly, so Ollama need not be running.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ragidx.indexer.errors import RagidxError

PREFIX = "ollama:"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
SERVICE_FOLDER = Path("/usr/share/ollama/.ollama/models")  # the Linux installer's system service
DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


def is_ollama_name(model: str) -> bool:
    return model.startswith(PREFIX)


def models_folder() -> Path:
    """Where Ollama keeps its models on this machine (the first that exists, else the default)."""
    configured = os.environ.get("OLLAMA_MODELS")
    if configured:
        return Path(configured).expanduser()
    home = Path("~/.ollama/models").expanduser()
    return home if home.is_dir() or not SERVICE_FOLDER.is_dir() else SERVICE_FOLDER


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    name: str
    tag: str

    @classmethod
    def parse(cls, model: str) -> OllamaName:
        """``ollama:[host/][namespace/]name[:tag]``."""
        text = model.removeprefix(PREFIX)
        path, _, tag = text.partition(":")
        parts = path.split("/")
        if not path or "" in parts or len(parts) > 3 or ".." in parts or not re.fullmatch(r"[\w.-]*", tag):
            raise RagidxError(
                f"'{model}' is not an Ollama model name: use ollama:NAME[:TAG], e.g. ollama:llama3.2:1b"
            )
        host = parts[0] if len(parts) == 3 else DEFAULT_HOST
        namespace = parts[-2] if len(parts) >= 2 else DEFAULT_NAMESPACE
        return cls(host, namespace, parts[-1], tag or DEFAULT_TAG)

    @property
    def short(self) -> str:
        """How Ollama shows it: ``llama3.2:1b``, ``user/model:tag``, ``hf.co/user/repo:tag``."""
        path = [self.namespace, self.name] if self.namespace != DEFAULT_NAMESPACE else [self.name]
        if self.host != DEFAULT_HOST:
            path = [self.host, self.namespace, self.name]
        return f"{'/'.join(path)}:{self.tag}"

    def manifest(self, folder: Path) -> Path:
        return folder / "manifests" / self.host / self.namespace / self.name / self.tag


@dataclass(frozen=True)
class OllamaModel:
    """A model Ollama has pulled: its name and the GGUF blob holding its weights."""

    name: OllamaName
    blob: Path
    sha256: str
    size: int


def find_ollama_model(model: str) -> OllamaModel:
    """The blob ``ollama:NAME[:TAG]`` names, or a one-line refusal naming the nearest models."""
    name = OllamaName.parse(model)
    folder = models_folder()
    manifest = name.manifest(folder)
    if not manifest.is_file():
        known = [found.name.short for found in list_ollama_models(folder)]
        near = difflib.get_close_matches(name.short, known, n=3, cutoff=0.5) or known[:3]
        hint = f"; nearest: {', '.join(near)}" if near else f" (no Ollama models in {folder})"
        raise RagidxError(
            f"no Ollama model '{name.short}' in {folder}{hint}; `ollama pull {name.short}` fetches it"
        )
    return _model_of(name, manifest, folder)


def _model_of(name: OllamaName, manifest: Path, folder: Path) -> OllamaModel:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError, AttributeError) as error:
        raise RagidxError(f"cannot read the Ollama manifest {manifest}: {error}") from None
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER:
            match = DIGEST.fullmatch(str(layer.get("digest", "")))
            if match is None:
                break
            blob = folder / "blobs" / f"sha256-{match.group(1)}"
            if not blob.is_file():
                raise RagidxError(
                    f"Ollama model '{name.short}': its weights {blob} are missing; `ollama pull {name.short}`"
                )
            return OllamaModel(name, blob, match.group(1), blob.stat().st_size)
    raise RagidxError(
        f"Ollama model '{name.short}' has no model layer (GGUF weights) in its manifest {manifest}"
    )


def list_ollama_models(folder: Path | None = None) -> list[OllamaModel]:
    """Every model in Ollama's store with readable weights, by name."""
    folder = folder or models_folder()
    manifests = folder / "manifests"
    found = []
    for manifest in sorted(manifests.glob("*/*/*/*")) if manifests.is_dir() else []:
        host, namespace, name, tag = manifest.relative_to(manifests).parts
        try:
            found.append(_model_of(OllamaName(host, namespace, name, tag), manifest, folder))
        except RagidxError:
            continue  # a manifest without weights (a partial pull) is not offered
    return found
