"""Embeddings computed between the steps of running generations: the running requests' tokens
are unchanged (the pooler borrows only free KV blocks, given back before the next step) and,
with LoRA, the pooled forward runs the base model, not the last step's per-token adapter slots."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from folio.lora.request import LoRARequest
from folio.pooling_params import PoolerConfig
from tests.helpers.adapters import make_peft_adapter
from tests.helpers.checkpoints import make_tiny_checkpoint

EMBED = [list(range(5, 10)), list(range(40, 70))]
GEN = [list(range(5 + i, 30 + i)) for i in range(3)]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed_lora")
    base = make_tiny_checkpoint("llama", root / "base")
    adapter = make_peft_adapter(base, root / "adapter", seed=1, r=4, lora_alpha=8)
    llm = LLM(model=base, dtype="float32", device="cpu", max_model_len=128, enable_lora=True,
              max_lora_rank=8, max_loras=2)
    return llm, LoRARequest("a", 1, adapter)


def _generate(llm: LLM, lora: LoRARequest, tag: str, embed_at_step: int | None):
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for i, ids in enumerate(GEN):
        engine.add_request(f"{tag}{i}", {"prompt_token_ids": ids}, params, lora_request=lora if i else None)
    tokens, vectors, steps = {}, None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id[len(tag):]] = out.outputs[0].token_ids
        steps += 1
        if steps == embed_at_step:
            vectors = engine.embed(EMBED, PoolerConfig())
    return tokens, vectors


def test_embedding_between_adapter_steps(case):
    llm, lora = case
    alone = [o.outputs.embedding for o in llm.embed([{"prompt_token_ids": p} for p in EMBED], use_tqdm=False)]
    reference, _ = _generate(llm, lora, "ref", None)
    tokens, vectors = _generate(llm, lora, "mid", 3)
    assert tokens == reference  # the running requests' K/V untouched
    assert vectors == alone  # the base model's embeddings, not the adapter's
    after = [o.outputs.embedding for o in llm.embed([{"prompt_token_ids": p} for p in EMBED], use_tqdm=False)]
    assert after == alone  # the last step's adapter mapping is not applied either
