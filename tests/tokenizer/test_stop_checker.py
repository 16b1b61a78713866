"""Stop strings: where the text is cut, which stop wins, and what is safe to stream before the cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from folio.engine.stop_checker import StopMatch, find_stop, streamable_length


def test_stop_spanning_chunks_is_cut_before_the_stop():
    text = "Hello wor" + "ld! More"
    assert find_stop(text, len("ld! More"), ["world"]) == StopMatch("world", 6)
    assert find_stop(text, len("ld! More"), ["world"], include_stop_str_in_output=True) == ("world", 11)


def test_stop_entirely_in_old_text_is_not_reported_again():
    assert find_stop("a STOP b", 2, ["STOP"]) is None
    assert find_stop("a STOP b", 3, ["STOP"]) == ("STOP", 2)


def test_first_completed_stop_wins_and_ties_go_to_the_longest():
    # "b" completes at 2, "abc" at 3: a character-by-character check stops at "b".
    assert find_stop("xabc", 4, ["abc", "b"]) == ("b", 2)
    # Both end at the same character: cut before the longer one.
    assert find_stop("xabc", 4, ["c", "bc"]) == ("bc", 2)
    assert find_stop("xabc", 4, ["c", "bc"], include_stop_str_in_output=True) == ("bc", 4)


def test_no_stops_or_no_new_text():
    assert find_stop("anything", 3, []) is None
    assert find_stop("anything", 0, ["thing"]) is None


def test_streamable_length_holds_back_a_possible_stop_start():
    assert streamable_length("Hello wor", ["world"]) == len("Hello ")
    assert streamable_length("Hello wor", ["xyz"]) == len("Hello wor")
    # The longest candidate suffix counts, whichever stop it belongs to.
    assert streamable_length("abcab", ["abx", "cabz"]) == 2
    # Text already sent stays sent.
    assert streamable_length("Hello wor", ["world"], already_sent=8) == 8


# ---- properties ------------------------------------------------------------------------------

_ALPHABET = "ab c\n"
stops_strategy = st.lists(st.text(_ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3)
chunks_strategy = st.lists(st.text(_ALPHABET, min_size=1, max_size=5), min_size=1, max_size=12)


def _oracle(text: str, new_len: int, stops: list[str], include: bool) -> StopMatch | None:
    """Brute force: every end position in the new text, earliest first, longest stop first."""
    for end in range(len(text) - new_len + 1, len(text) + 1):
        matching = [s for s in stops if text[:end].endswith(s)]
        if matching:
            stop = max(matching, key=len)
            return StopMatch(stop, end if include else end - len(stop))
    return None


def _stream(chunks: list[str], stops: list[str], include: bool) -> tuple[str, list[str], StopMatch | None]:
    """Feed chunks as an engine would: returns the final text, what was shown, and the stop."""
    text, shown = "", []
    for chunk in chunks:
        text += chunk
        match = find_stop(text, len(chunk), stops, include)
        assert match == _oracle(text, len(chunk), stops, include)
        if match is not None:
            final = text[: match.cut]
            shown.append(final[len("".join(shown)) :])
            return final, shown, match
        end = streamable_length(text, stops, len("".join(shown)))
        shown.append(text[len("".join(shown)) : end])
    shown.append(text[len("".join(shown)) :])  # finished without a stop: the rest is released
    return text, shown, None


@settings(max_examples=300, deadline=None)
@given(chunks=chunks_strategy, stops=stops_strategy, include=st.booleans())
def test_stream_never_shows_text_that_is_cut(chunks, stops, include):
    final, shown, _ = _stream(chunks, stops, include)
    assert "".join(shown) == final  # shown pieces only ever extend, and add up to the final text
    for i in range(len(shown)):
        assert final.startswith("".join(shown[: i + 1]))


@settings(max_examples=300, deadline=None)
@given(chunks=chunks_strategy, stops=stops_strategy, include=st.booleans())
def test_result_does_not_depend_on_how_text_is_chunked(chunks, stops, include):
    by_chunk = _stream(chunks, stops, include)
    by_char = _stream(list("".join(chunks)), stops, include)
    assert by_chunk[0] == by_char[0] and by_chunk[2] == by_char[2]


@settings(max_examples=300, deadline=None)
@given(text=st.text(_ALPHABET, max_size=12), stops=stops_strategy)
def test_held_back_suffix_is_the_longest_stop_prefix(text, stops):
    expected_hold = max(
        (k for s in stops for k in range(1, len(s)) if k <= len(text) and text.endswith(s[:k])),
        default=0,
    )
    assert streamable_length(text, stops) == len(text) - expected_hold
