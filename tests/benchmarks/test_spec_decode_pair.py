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
