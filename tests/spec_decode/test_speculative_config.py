"""SpeculativeConfig: vLLM's dict and JSON forms, and a clear error for each bad input."""

from __future__ import annotations

import pytest

from folio.config import SpeculativeConfig
from folio.engine.arg_utils import EngineArgs


def test_ngram_and_draft_model_forms():
    c = SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5})
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 4, 5, 1)
    d = SpeculativeConfig.from_user('{"model": "/x", "num_speculative_tokens": 2}')
    assert (d.method, d.model) == ("draft_model", "/x")
    assert SpeculativeConfig.from_user(None) is None


@pytest.mark.parametrize(
    "value, message",
    [
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "positive"),
        ({"method": "eagle9", "num_speculative_tokens": 2}, "method"),
        ({"num_speculative_tokens": 2}, "needs 'method'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "Unknown speculative_config key"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "larger"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ("{not json", "not valid JSON"),
        ([1, 2], "must be a dict"),
    ],
)
def test_bad_configs_are_value_errors(value, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_user(value)


def test_cli_flag_and_vocabulary_check(tmp_path):
    from tests.helpers.checkpoints import make_tiny_checkpoint

    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']))
    assert args.speculative_config == '{"method": "ngram", "num_speculative_tokens": 3}'
    target = make_tiny_checkpoint("llama", tmp_path / "t")
    draft = make_tiny_checkpoint("opt", tmp_path / "d", vocab_size=900)
    engine_args = EngineArgs(model=target, device="cpu", speculative_config={"model": draft, "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="vocabulary"):
        engine_args.create_engine_config()
    short = make_tiny_checkpoint("qwen3", tmp_path / "s", max_position_embeddings=64)
    with pytest.raises(ValueError, match="speculative_config model .*trained context"):
        EngineArgs(model=target, device="cpu", speculative_config={"model": short, "num_speculative_tokens": 2}).create_engine_config()
    config = EngineArgs(model=target, device="cpu", speculative_config=args.speculative_config).create_engine_config()
    assert config.speculative.method == "ngram" and config.draft_model is None
