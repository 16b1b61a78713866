"""Log records of folio's loggers in tests: folio's logger does not propagate to the root, where
pytest's caplog listens, so a test that asserts on folio's log lines attaches a handler here."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def log_records(level: int = logging.DEBUG, names: tuple[str, ...] = ("folio",)) -> Iterator[list[logging.LogRecord]]:
    """The records at `level` or above that the named loggers handle while the block runs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
