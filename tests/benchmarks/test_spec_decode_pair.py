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


def test_batch_engines_take_turns_and_report_per_round_ratios(tmp_path):
    """run_rounds keeps every configuration's engine alive (a fixed KV cache each) and times
    one generate per engine per group of prompts, rotating the order: each result has one ratio
    per group against the first configuration, their median, and the first's ratios are all 1."""
    from folio.benchmarks.spec_decode import plain_prompts, run_rounds

    draft, target = build_pair(str(tmp_path), "cpu", steps=2, target_hidden=64, target_layers=2, batch_size=2, draft_layers=1)
    specs = [None, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
             {"model": draft, "num_speculative_tokens": 2}]
    results = run_rounds(target, specs, [plain_prompts(3)] * 2 + [plain_prompts(1)], 6, device="cpu", max_model_len=128,
                         max_num_seqs=4, num_gpu_blocks_override=64)
    assert [len(r["round_ratios"]) for r in results] == [3, 3, 3]
    assert results[0]["round_ratios"] == [1.0] * 3 and results[0]["median_ratio"] == 1.0
    assert all(r["tokens"] == (3 + 3 + 1) * 6 for r in results)
    assert results[1]["outputs"] == results[0]["outputs"] == results[2]["outputs"]  # greedy: speculation is exact
    assert results[2]["acceptance_rate"] is not None
