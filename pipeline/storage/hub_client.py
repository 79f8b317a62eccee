"""The hub client (huggingface_hub) as tokshard uses it: its own retries, without their lines.

Unreachable, the client retries each request five times over about 25 s and logs two lines a
try; a command says what failed in one line of its own, so those lines are left out while
tokshard asks the hub.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: the client's logger of each failed request and each retry's wait
RETRIES = "huggingface_hub.utils._http"


@contextlib.contextmanager
def quiet(*loggers: str) -> Iterator[None]:
    """No warnings from these loggers meanwhile (errors still pass)."""
    found = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in found]
    for logger in found:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(found, levels, strict=True):
            logger.setLevel(level)
