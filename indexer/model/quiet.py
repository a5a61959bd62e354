"""One switch for transformers' and the hub's own chatter while ragidx loads or converts a model."""

from __future__ import annotations

import logging


def quiet_transformers() -> None:
    """Hub retries and weight loading print warnings and bars; the user gets one clear line instead."""
    from transformers.utils import logging as transformers_logging

    for name in ("huggingface_hub", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers_logging.disable_progress_bar()
