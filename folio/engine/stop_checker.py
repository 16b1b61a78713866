"""Stop strings: where an output must end, and how much of it is safe to stream before it does.

A stop string can span token boundaries, so it is searched in the text, not in tokens. Each step
only the part that could end inside the new text is searched, which keeps the check
O(new text + stop length) per step (earlier text was searched in earlier steps).

Which stop wins: the one that is *completed* first (earliest end; on a tie, the longest, which
starts first). That is the result a character-by-character check would give, so it does not
depend on how the text was split into tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopMatch(NamedTuple):
    stop: str  # the stop string that matched (CompletionOutput.stop_reason)
    cut: int  # the output text's length after the cut


def find_stop(
    text: str,
    new_len: int,
    stops: Sequence[str],
    include_stop_str_in_output: bool = False,
) -> StopMatch | None:
    """The first stop string completed within the last `new_len` characters of `text`, or None.

    The cut is before the stop string, or right after it with `include_stop_str_in_output`;
    anything after the stop string is always cut.
    """
    if new_len <= 0 or not stops:
        return None
    new_start = len(text) - new_len
    best: tuple[int, int, str] | None = None  # (end, -length, stop): smallest wins
    for stop in stops:
        # A match ending in the new text starts at most len(stop) - 1 characters before it.
        index = text.find(stop, max(0, new_start - len(stop) + 1))
        if index < 0:
            continue
        candidate = (index + len(stop), -len(stop), stop)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    if best is None:
        return None
    end, neg_length, stop = best
    return StopMatch(stop, end if include_stop_str_in_output else end + neg_length)


def streamable_length(text: str, stops: Sequence[str], already_sent: int = 0) -> int:
    """How much of `text` may be shown now: all but a suffix that could still begin a stop string.

    Held back: the longest suffix of `text` that is a proper prefix of some stop string, so a
    stream never shows part of a stop string that the cut will remove. Text already sent stays
    sent (the result is at least `already_sent`).
    """
    hold = 0
    for stop in stops:
        # Only a longer candidate than the current hold can change the result.
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return max(already_sent, len(text) - hold)
