"""Logging: one `folio` logger tree, a compact format, level from FOLIO_LOGGING_LEVEL."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
_configured = False


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("folio")
    if os.environ.get("FOLIO_CONFIGURE_LOGGING", "1") == "0":
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(os.environ.get("FOLIO_LOGGING_LEVEL", "INFO").upper())
    root.propagate = False


def init_logger(name: str) -> logging.Logger:
    """The logger for module `name` (pass __name__), under the shared `folio` handler."""
    _configure_root()
    return logging.getLogger(name)
