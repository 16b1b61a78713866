"""Allocation failures at startup turned into a ValueError naming the flags that sized the buffer.

folio/config/memory.py refuses host buffers that cannot fit before anything is built; what it
does not bound (device memory, or a machine that has less free than it had then) still fails
here, as torch's or numpy's out-of-memory error, which the CLI printed as a traceback naming a
tensor shape rather than the flag to lower.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

# How torch's CPU allocator and CUDA caching allocator word a failed allocation.
_ALLOCATION_MESSAGES = re.compile(r"can't allocate memory|out of memory|Unable to allocate", re.IGNORECASE)


def is_allocation_failure(error: BaseException) -> bool:
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):  # numpy's _ArrayMemoryError too
        return True
    return isinstance(error, RuntimeError) and bool(_ALLOCATION_MESSAGES.search(str(error)))


@contextlib.contextmanager
def named_allocation(what: str, *names: str) -> Iterator[None]:
    """Run the block; an allocation failure in it becomes a ValueError naming `names` (arguments,
    each shown with its flag) and saying what the allocator was asked for."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not is_allocation_failure(e):
            raise
        flags = ", ".join(f"{name} (--{name.replace('_', '-')})" for name in names)
        raise ValueError(f"Not enough memory for {what}: {_asked(e)}. Lower {flags}.") from None


def _asked(error: BaseException) -> str:
    """The allocator's own words on the size, in one short line."""
    text = " ".join(str(error).split())
    match = re.search(r"(?:tried|unable) to allocate \d+(?:\.\d*)?\s*\w+", text, re.IGNORECASE)
    if match:
        return "the allocator was asked for " + match.group(0).split(" allocate ", 1)[1]
    return text[:200] or type(error).__name__
