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
    handler.addFilter(_rank_filter)  # on the handler: logger filters skip child loggers' records
    root.addHandler(handler)
    root.setLevel(os.environ.get("FOLIO_LOGGING_LEVEL", "INFO").upper())
    root.propagate = False


class _RankFilter(logging.Filter):
    """Prefixes each message with "[rank N] " while this process is one rank of several."""

    rank: int | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.rank is not None and not getattr(record, "_folio_ranked", False):
            record.msg = f"[rank {self.rank}] {record.msg}"
            record._folio_ranked = True
        return True


_rank_filter = _RankFilter()


def set_log_rank(rank: int | None) -> None:
    """Name this process's tensor-parallel rank in every folio log line (None: stop)."""
    _configure_root()
    _rank_filter.rank = rank


def init_logger(name: str) -> logging.Logger:
    """The logger for module `name` (pass __name__), under the shared `folio` handler."""
    _configure_root()
    return logging.getLogger(name)
