"""MkDocs hooks for this site (`hooks:` in mkdocs.yml).

Run as the `mkdocs` script, Python puts the script's folder first on `sys.path`, and in a
virtualenv that folder also holds the `ragidx` console script, which mkdocstrings' loader (griffe)
then takes for the `ragidx` package: every API page failed with "ragidx.app.retriever.Index could
not be found" (`python -m mkdocs`, whose first path is the checkout, worked). The script folders
are dropped from the path before the API pages are read.
"""

from __future__ import annotations

import sys
from pathlib import Path


def on_startup(**_: object) -> None:
    sys.path[:] = [entry for entry in sys.path if not (Path(entry or ".") / "ragidx").is_file()]
