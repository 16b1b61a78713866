"""The CPU cache of adapters (max_cpu_loras) never drops an adapter that unfinished requests use:
its folder is read when the request arrives, never again mid-run (where a failed read would take
down the engine's step, and every request with it)."""

from __future__ import annotations

import shutil

import pytest

from folio import LLM, SamplingParams
from folio.lora.request import LoRARequest
from tests.helpers.adapters import make_peft_adapter
from tests.helpers.checkpoints import make_tiny_checkpoint

pytestmark = pytest.mark.slow


def test_an_adapter_in_use_is_not_read_again(tmp_path):
    base = make_tiny_checkpoint("llama", tmp_path / "base")
    one = make_peft_adapter(base, tmp_path / "one", seed=1, r=4, target_modules=["q_proj"])
    two = make_peft_adapter(base, tmp_path / "two", seed=2, r=4, target_modules=["q_proj"])
    llm = LLM(model=base, dtype="float32", device="cpu", max_model_len=64, enable_lora=True,
              max_loras=1, max_cpu_loras=1, max_lora_rank=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("a", {"prompt_token_ids": [5, 6, 7]}, params, lora_request=LoRARequest("one", 1, one))
    engine.add_request("b", {"prompt_token_ids": [5, 6, 7]}, params, lora_request=LoRARequest("two", 2, two))
    shutil.rmtree(one)  # its adapter was read when "a" arrived
    finished = set()
    for _ in range(50):
        finished |= {o.request_id for o in engine.step() if o.finished}
        if not engine.has_unfinished_requests():
            break
    assert finished == {"a", "b"}
    assert engine.list_loras() <= {1, 2}
