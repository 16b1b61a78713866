"""The speculative-decoding benchmark pair: a draft and a target of the shapes asked for, both
trained on the demo corpus with one tokenizer (the vocabulary a draft must share)."""

from __future__ import annotations

import json
import os

from folio.benchmarks.spec_decode_pair import build_pair


def test_pair_has_the_requested_depths_and_one_vocabulary(tmp_path):
    draft, target = build_pair(str(tmp_path), "cpu", steps=2, target_hidden=64, target_layers=3, batch_size=2, draft_layers=1)
    configs = [json.load(open(os.path.join(path, "config.json"))) for path in (draft, target)]
    assert [c["num_hidden_layers"] for c in configs] == [1, 3]
    assert configs[1]["hidden_size"] == 64 and configs[0]["vocab_size"] == configs[1]["vocab_size"]
    tokenizers = [open(os.path.join(path, "tokenizer.json")).read() for path in (draft, target)]
    assert tokenizers[0] == tokenizers[1]


def test_quoted_documents_follow_the_plain_ones_and_prompts_match_them():
    """quote_repeats adds each document followed by QUOTE_SEPARATOR and itself; the copy-heavy
    benchmark's prompts are such a quote cut after an opening no other document shares."""
    from folio.benchmarks.spec_decode import copy_prompts
    from folio.demo.corpus import pretraining_documents
    from folio.demo.tokenizer import build_tokenizer
    from folio.demo.trainer import QUOTE_SEPARATOR, TrainingRecipe, training_tokens

    tokenizer = build_tokenizer(1000)
    plain = training_tokens(tokenizer, TrainingRecipe(quote_repeats=0))
    quoted = training_tokens(tokenizer, TrainingRecipe(quote_repeats=1))
    text = tokenizer.decode(quoted)
    doc = pretraining_documents(0)[0]
    assert doc + QUOTE_SEPARATOR + doc in text and doc + QUOTE_SEPARATOR + doc not in tokenizer.decode(plain)
    count = lambda t: len(tokenizer(t).input_ids)  # noqa: E731
    prompts = copy_prompts(3, count, 64)
    for prompt in prompts:
        document, opening = prompt.split(QUOTE_SEPARATOR)
        assert document.startswith(opening) and count(document) - count(opening) >= 64
        others = [d for d in pretraining_documents(0) if d != document]
        assert not any(d.startswith(opening) for d in others)  # the opening names one document
