"""Keep the long-lived start-up heap out of the garbage collector's scans.

An engine's start leaves a large, long-lived Python heap (the model's modules, the tokenizer's
vocabulary, the server's routes: 200k+ objects). CPython's full collections walk all of it, and
the step loop allocates enough to trigger one every few hundred steps: measured on the
development machine, 44 collections over one 33-step run of 256 requests cost 0.134 s, 0.005 s
with the heap frozen (the run 9% faster). gc.freeze() moves everything alive into a permanent
generation that collections skip (vLLM and SGLang freeze their engine processes after start);
what is allocated later is collected as usual.

- freeze_startup_heap: in processes folio owns (`folio serve`, the engine's own process), once
  after start.
- frozen_heap_while_running: around the offline step loop (LLM.generate), in the user's
  process: frozen on entry, unfrozen on exit (both O(1) list moves), so the user's own garbage
  is collected as before once generate returns, and `del llm; gc.collect()` frees the engine.
  Overlapping loops (several threads) share one freeze, undone when the last ends; while any
  runs, a gc.collect() elsewhere in the process does not free what was alive when it began.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from folio.logger import init_logger

logger = init_logger(__name__)

_process_frozen = False
_runs_lock = threading.Lock()
_runs = 0  # frozen_heap_while_running blocks under way, in all threads
_froze_for_runs = False  # those blocks froze the heap: the last to end unfreezes it


def freeze_startup_heap(what: str) -> int:
    """Collect, then freeze what is left for the rest of the process; returns (and logs) how
    many objects were frozen."""
    global _process_frozen
    gc.collect()
    gc.freeze()
    _process_frozen = True
    frozen = gc.get_freeze_count()
    logger.info("%s: %d start-up objects left out of garbage collection (gc.freeze)", what, frozen)
    return frozen


@contextlib.contextmanager
def frozen_heap_while_running() -> Iterator[None]:
    """Freeze the heap for the duration of the block, unless something else froze it already
    (the process's owner, or the user), which is then left as it was. Blocks that overlap (nested,
    or generate loops in several threads) share one freeze, undone when the last of them ends:
    one thread's end must not unfreeze the heap under another's loop."""
    global _runs, _froze_for_runs
    entered = False
    try:
        with _runs_lock:
            if _runs == 0 and not _process_frozen and gc.get_freeze_count() == 0:
                gc.freeze()
                _froze_for_runs = True
            _runs += 1
            entered = True
        yield
    finally:
        if entered:
            with _runs_lock:
                _runs -= 1
                if _runs == 0 and _froze_for_runs:
                    _froze_for_runs = False
                    gc.unfreeze()
