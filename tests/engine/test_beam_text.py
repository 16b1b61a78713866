"""A beam's text follows the request's skip_special_tokens, as a sampled request's does (the
server passes the field through; beam search used to keep special tokens whatever it said)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from folio.engine.beam_search import BeamSearch
from folio.entrypoints.openai.protocol.completion import CompletionRequest
from folio.sampling_params import BeamSearchParams
from tests.helpers.tokenizers import test_tokenizer


def _text(params: BeamSearchParams, tokens: list[int], reason: str = "length") -> str:
    search = SimpleNamespace(params=params)  # _text reads only the params
    return BeamSearch._text(search, test_tokenizer(), SimpleNamespace(token_ids=tokens), reason)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_inside_a_beam_follow_the_request(skip):
    tok = test_tokenizer()
    words = tok.encode("hello world", add_special_tokens=False)
    tokens = words + [tok.eos_token_id] + words  # ignore_eos: the special token sits mid-beam
    text = _text(BeamSearchParams(beam_width=2, max_tokens=8, skip_special_tokens=skip), tokens)
    assert text == tok.decode(tokens, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    assert (tok.eos_token in text) is not skip


def test_the_server_passes_the_fields_to_the_search():
    request = CompletionRequest(prompt="Hi", n=2, use_beam_search=True, skip_special_tokens=False,
                                spaces_between_special_tokens=False)
    params = request.to_beam_search_params(max_tokens=4)
    assert params.skip_special_tokens is False and params.spaces_between_special_tokens is False
    assert CompletionRequest(prompt="Hi", n=2, use_beam_search=True).to_beam_search_params(4).skip_special_tokens
