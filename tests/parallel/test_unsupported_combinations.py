"""Features not yet carried across ranks are refused with tensor_parallel_size > 1, naming the
argument, before any worker starts (never a silent single-rank fallback)."""

from __future__ import annotations

import pytest

from folio.engine.arg_utils import EngineArgs
from tests.helpers.checkpoints import make_tiny_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tp-combos") / "llama")


@pytest.mark.parametrize(
    "extra, name",
    [
        ({"enable_lora": True}, "enable_lora"),
        ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative_config"),
    ],
)
def test_refused_with_tensor_parallel(llama, extra, name):
    args = EngineArgs.from_kwargs(model=llama, device="cpu", tensor_parallel_size=2, **extra)
    with pytest.raises(ValueError, match=name):
        args.create_engine_config()


@pytest.mark.parametrize("extra", [{"enable_lora": True},
                                   {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}])
def test_accepted_on_one_rank(llama, extra):
    config = EngineArgs.from_kwargs(model=llama, device="cpu", **extra).create_engine_config()
    assert config.parallel.tensor_parallel_size == 1
