"""Importing faiss, with a one-line answer where its install is broken.

faiss-cpu and faiss-gpu-cu12 (and the older faiss-gpu) all install the same package, ``faiss``.
pip lets two of them in together, each overwriting the other's files, and ``import faiss`` then
fails inside SWIG's wrappers: faiss-cpu 1.15.1 with faiss-gpu-cu12 1.14.1.post1 (what ``pip install
faiss-cpu faiss-gpu-cu12`` gave on 2026-11-26) raised ``AttributeError: module 'faiss._swigfaiss'
has no attribute 'delete_GpuResourcesVector'``. Uninstalling one afterwards deletes files the
other wrote, so the way out is to remove every one and install one again.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from ragidx.indexer.errors import RagidxError

# The distributions on PyPI that install the ``faiss`` package.
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu-cu11", "faiss-gpu")


def faiss_module() -> Any:
    """The ``faiss`` module, or a one-line error saying how to repair the install."""
    try:
        import faiss
    except (ImportError, AttributeError) as error:
        raise faiss_install_error(error) from error
    return faiss


def installed_faiss() -> list[tuple[str, str]]:
    """The faiss distributions installed here, with their versions."""
    found = []
    for name in FAISS_DISTRIBUTIONS:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return found


def faiss_install_error(error: BaseException) -> RagidxError:
    found = installed_faiss()
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    if len(found) > 1:
        versions = " and ".join(f"{name} {version}" for name, version in found)
        return RagidxError(
            f"faiss cannot be imported: {versions} are installed together and overwrite each other's "
            f"files ({reason}); keep one: pip uninstall -y {' '.join(name for name, _ in found)} && pip "
            "install faiss-cpu (or faiss-gpu-cu12 on a CUDA host)"
        )
    if not found:
        return RagidxError(f"faiss is not installed ({reason}); pip install faiss-cpu")
    return RagidxError(
        f"faiss cannot be imported ({reason}); reinstall it: pip install --force-reinstall {found[0][0]}"
    )
