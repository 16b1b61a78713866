"""Incremental detokenization equals a full decode, holds back partial characters, and stays O(window)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from folio.engine.detokenizer import (
    IncrementalDetokenizer,
    byte_fallback_ids,
    decode_token,
    special_token_ids,
    token_bytes,
)
from tests.helpers.tokenizers import SP_ADDED_PLAIN, sentencepiece_tokenizer, test_tokenizer

TOKENIZERS = {"byte_level": test_tokenizer, "sentencepiece": sentencepiece_tokenizer}
# Text with multi-byte characters (2, 3 and 4 bytes) that split over several tokens.
_TEXT = st.text(st.sampled_from(list("ab The cat\n.,") + ["é", "ü", "東", "京", "🙂", "👍", "ñ"]), max_size=24)


@st.composite
def token_ids(draw: st.DrawFn, tok: Any) -> list[int]:
    """Either tokens of real text (with special tokens mixed in) or arbitrary ids."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, len(tok) - 1), max_size=30))
    ids = tok.encode(draw(_TEXT), add_special_tokens=False)
    specials = sorted(special_token_ids(tok))
    for _ in range(draw(st.integers(0, 2))):
        ids.insert(draw(st.integers(0, len(ids))), draw(st.sampled_from(specials)))
    return ids


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i = [], 0
    for size in sizes:
        if i >= len(ids):
            break
        out.append(ids[i : i + size])
        i += size
    if i < len(ids):
        out.append(ids[i:])
    return out


def _run(tok: Any, prompt: list[int], output: list[int], sizes: list[int], skip: bool) -> tuple[str, IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    chunks = _chunks(output, sizes)
    deltas = [detok.append(c, finished=i == len(chunks) - 1) for i, c in enumerate(chunks)]
    return "".join(deltas), detok


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 4), max_size=30), skip=st.booleans())
def test_deltas_add_up_to_decode_of_the_output(name, data, sizes, skip):
    tok = TOKENIZERS[name]()
    output = data.draw(token_ids(tok))
    text, detok = _run(tok, [], output, sizes, skip)
    assert text == detok.output_text == tok.decode(output, skip_special_tokens=skip)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 4), max_size=30), skip=st.booleans())
def test_deltas_are_the_text_the_output_adds_after_the_prompt(name, data, sizes, skip):
    tok = TOKENIZERS[name]()
    prompt, output = data.draw(token_ids(tok)), data.draw(token_ids(tok))
    full = tok.decode(prompt + output, skip_special_tokens=skip)
    before = tok.decode(prompt, skip_special_tokens=skip)
    if before.endswith("\ufffd"):
        # The prompt ends inside a character: the output's bytes are decoded on their own.
        expected = tok.decode(output, skip_special_tokens=skip)
    else:
        # Documented exception (byte fallback only): a prompt ending in byte tokens whose run the
        # output's first byte tokens turn into invalid UTF-8 reads differently in context.
        assume(full.startswith(before))
        expected = full[len(before) :]
    text, _ = _run(tok, prompt, output, sizes, skip)
    assert text == expected
    if name == "byte_level":  # byte-level decoding is concatenative: context changes nothing
        assert text == tok.decode(output, skip_special_tokens=skip)


def test_sentencepiece_first_token_keeps_its_space_after_a_prompt():
    tok = sentencepiece_tokenizer()
    prompt, output = tok.encode("Hello", add_special_tokens=False), tok.encode(" world", add_special_tokens=False)
    assert tok.decode(output) == "world"  # alone, the decoder strips the leading space
    assert _run(tok, prompt, output, [1], True)[0] == " world"
    # ...also when the prompt ends in special tokens that the decode skips.
    prompt_with_specials = prompt + [tok.eos_token_id] * 3
    assert _run(tok, prompt_with_specials, output, [1], True)[0] == " world"


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_partial_character_is_held_until_complete(name):
    tok = TOKENIZERS[name]()
    ids = tok.encode("a東b", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.append([i]) for i in ids]
    assert len(ids) > 3  # 東 spans several tokens
    assert "".join(deltas) == "a東b"
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_finished_releases_an_incomplete_character(name):
    tok = TOKENIZERS[name]()
    first = tok.encode("東", add_special_tokens=False)[0]
    detok = IncrementalDetokenizer(tok, [])
    assert detok.append([first]) == ""
    assert detok.append([], finished=True) == tok.decode([first]) == "\ufffd" * len(tok.decode([first]))


def test_byte_fallback_run_is_held_until_it_ends():
    # "=" is complete, but an invalid byte after it turns the whole run into U+FFFD.
    tok = sentencepiece_tokenizer()
    eq, c0 = tok.convert_tokens_to_ids(["<0x3D>", "<0xC0>"])
    detok = IncrementalDetokenizer(tok, [])
    assert detok.append([eq]) == ""
    assert detok.append([c0]) == ""
    word = tok.encode("a", add_special_tokens=False)
    assert detok.output_text + detok.append(word) == tok.decode([eq, c0] + word)
    assert len(byte_fallback_ids(tok)) == 256 and not byte_fallback_ids(test_tokenizer())


@pytest.mark.parametrize("skip", [True, False])
def test_special_and_added_tokens(skip):
    tok = sentencepiece_tokenizer()
    ids = tok.encode(f"Hi <|im_end|> there {SP_ADDED_PLAIN} x", add_special_tokens=False)
    text, _ = _run(tok, [tok.bos_token_id], ids, [1] * len(ids), skip)
    assert (("<|im_end|>" in text) is not skip) and SP_ADDED_PLAIN in text  # added != special


class _Recording:
    """Forwards to a tokenizer (or its Rust backend), recording how many ids each decode gets."""

    def __init__(self, target: Any, lengths: list[int]) -> None:
        self._target, self.decode_lengths = target, lengths

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.decode_lengths.append(len(ids))
        return self._target.decode(ids, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _RecordingTokenizer(_Recording):
    def __init__(self, tok: Any) -> None:
        super().__init__(tok, [])
        self._tok = tok
        self.backend_tokenizer = _Recording(tok.backend_tokenizer, self.decode_lengths)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_each_step_decodes_a_bounded_window(name):
    tok = _RecordingTokenizer(TOKENIZERS[name]())
    ids = tok.encode("The cat sat on the warm window and watched the rain. 東京 🙂 " * 20, add_special_tokens=False)
    prompt = tok.encode("Once upon a time", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    for i in ids:
        detok.append([i])
    full, before = tok._tok.decode(prompt + ids), tok._tok.decode(prompt)
    assert detok.output_text == full[len(before) :]
    assert len(ids) > 300 and max(tok.decode_lengths) <= 12
    # About one decode per step (two without the cache of one-token windows' text).
    assert len(tok.decode_lengths) <= 1.2 * len(ids) + len(set(ids))


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_decode_token_reads_as_inside_a_text(name):
    tok = TOKENIZERS[name]()
    (the,) = tok.encode(" the", add_special_tokens=False)[-1:]
    assert decode_token(tok, the) == " the"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert decode_token(tok, im_end) == "<|im_end|>"  # log-probs show special tokens
    assert decode_token(tok, the) is decode_token(tok, the)  # cached


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_token_bytes_of_partial_characters_join_to_utf8(name):
    tok = TOKENIZERS[name]()
    ids = tok.encode(" 東🙂", add_special_tokens=False)
    assert any("\ufffd" in decode_token(tok, i) for i in ids)  # some tokens hold part of one
    assert b"".join(token_bytes(tok, i) for i in ids) == " 東🙂".encode()
