"""On a GPU: LoRA through the Triton kernels and CUDA graphs gives the tokens of the plain path.

float32, the tiny Llama and two PEFT adapters: a batch mixing the base model and both adapters,
run (a) on the fast path (Triton shrink/expand, Triton attention, decode steps replayed from CUDA
graphs) and (b) on the torch reference path (eager), must give the same greedy tokens, and both
must equal transformers + PeftModel. bfloat16: under CUDA graphs the tokens under each adapter
differ from the base model's (the replayed decode steps read the slots).
"""

from __future__ import annotations

import pytest
import torch

from folio import LLM, SamplingParams
from folio.kernels.triton_compat import set_triton_kernels
from tests.helpers.adapters import two_adapter_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
MAX_NEW = 16
ORDER = [None, "small", "wide", "small", None, "wide", "wide", None, "small"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return two_adapter_case(tmp_path_factory.mktemp("lora-gpu"), wide_rank=16, max_new=MAX_NEW)


def _run(case, *, fast: bool, dtype: str = "float32", graphs: bool | None = None) -> list[list[int]]:
    """fast: Triton layer + LoRA kernels; graphs (default: fast): Triton attention + CUDA graphs."""
    base, prompts, _, adapters = case
    graphs = fast if graphs is None else graphs
    previous = set_triton_kernels(fast)
    try:
        llm = LLM(model=base, device="cuda", dtype=dtype, num_gpu_blocks_override=256, max_num_seqs=16,
                  max_model_len=128, enable_lora=True, max_loras=2, max_lora_rank=16,
                  attention_backend="triton" if graphs else "torch", enforce_eager=not graphs)
        if graphs:
            assert llm.llm_engine.runner.graphs is not None, "decode steps replay CUDA graphs"
        batch = [{"prompt_token_ids": prompts[i % 3]} for i in range(len(ORDER))]
        loras = [adapters[n] if n else None for n in ORDER]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        return [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False, lora_request=loras)]
    finally:
        set_triton_kernels(previous)


def test_fast_path_equals_reference_path_and_peft(case):
    refs = case[2]
    expected = [refs[n or "base"][i % 3] for i, n in enumerate(ORDER)]
    assert _run(case, fast=False) == expected
    assert _run(case, fast=True) == expected
    # the plain path (FOLIO_TRITON_KERNELS=0) reads nothing back to the host: graphs capture it
    assert _run(case, fast=False, graphs=True) == expected


def test_bfloat16_adapters_act_under_graphs(case):
    tokens = _run(case, fast=True, dtype="bfloat16")
    base, small, wide = tokens[0], tokens[3], tokens[6]  # prompt 0 under each (ORDER)
    assert small != base and wide != base and small != wide


def test_steps_without_adapters_replay_the_graphs_without_lora_kernels(case):
    """An engine with LoRA on, running requests without adapters, replays the second set of
    graphs (captured without the LoRA kernels) and gives the base model's tokens; a batch with
    adapters still gets theirs."""
    base, prompts, refs, adapters = case
    llm = LLM(model=base, device="cuda", dtype="float32", num_gpu_blocks_override=256, max_num_seqs=16,
              max_model_len=128, enable_lora=True, max_loras=2, max_lora_rank=16)
    graphs = llm.llm_engine.runner.graphs
    assert graphs is not None and set(graphs.base_graphs) == set(graphs.graphs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    plain = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in plain] == refs["base"]
    wide = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                        lora_request=adapters["wide"])
    assert [o.outputs[0].token_ids for o in wide] == refs["wide"]
