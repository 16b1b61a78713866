"""Greedy tokens under LoRA adapters equal transformers + PeftModel, in float32 on the CPU.

Two adapters unlike each other (rank 4 on q/v/down with plain scaling; rank 8 on every
projection with rsLoRA) on a tiny Llama with biases and GQA: each alone, then one batch that
runs the same prompts under the base model and both adapters at once. The batch shares a
prefix cache, so equal tokens there also prove that K/V never crosses adapters.
"""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from folio.lora.request import LoRARequest
from tests.helpers.adapters import two_adapter_case

MAX_NEW = 12
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return two_adapter_case(tmp_path_factory.mktemp("lora"), wide_rank=8, max_new=MAX_NEW)


@pytest.fixture(scope="module")
def llm(case) -> LLM:
    """Two slots and the prefix cache on: shared by the tests that fit it."""
    return _llm(case[0], enable_prefix_caching=True)


def _llm(base: str, **kwargs) -> LLM:
    kwargs.setdefault("max_loras", 2)
    return LLM(model=base, dtype="float32", device="cpu", max_model_len=128, enable_lora=True,
               max_lora_rank=8, **kwargs)


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_adapters_change_the_output(case):
    _, _, refs, _ = case
    assert refs["small"] != refs["base"] and refs["wide"] != refs["base"] and refs["small"] != refs["wide"]


def test_each_adapter_alone_matches_peft(case, llm):
    base, prompts, refs, adapters = case
    prompt_dicts = [{"prompt_token_ids": p} for p in prompts]
    for name in ("small", "wide"):
        assert _tokens(llm.generate(prompt_dicts, _greedy(), use_tqdm=False, lora_request=adapters[name])) == refs[name]
    assert _tokens(llm.generate(prompt_dicts, _greedy(), use_tqdm=False)) == refs["base"]


def test_one_batch_mixing_base_and_two_adapters(case, llm):
    base, prompts, refs, adapters = case
    order = [None, "small", "wide", "small", None, "wide", "wide", None, "small"]
    batch = [{"prompt_token_ids": prompts[i % 3]} for i in range(len(order))]
    loras = [adapters[n] if n else None for n in order]
    got = _tokens(llm.generate(batch, _greedy(), use_tqdm=False, lora_request=loras))
    expected = [refs[n or "base"][i % 3] for i, n in enumerate(order)]
    assert got == expected
    # Run again: now every prompt's blocks are cached, each under its own adapter only.
    again = llm.generate(batch, _greedy(), use_tqdm=False, lora_request=loras)
    assert _tokens(again) == expected
    assert any(o.num_cached_tokens for o in again), "the prefix cache served the repeat"


def test_more_adapters_than_slots_take_turns(case):
    base, prompts, refs, adapters = case
    llm = _llm(base, max_loras=1, max_cpu_loras=1)  # every switch reloads from the folder
    order = ["small", "wide", None, "wide", "small"]
    batch = [{"prompt_token_ids": prompts[i % 3]} for i in range(len(order))]
    got = _tokens(llm.generate(batch, _greedy(), use_tqdm=False, lora_request=[adapters[n] if n else None for n in order]))
    assert got == [refs[n or "base"][i % 3] for i, n in enumerate(order)]
    assert llm.llm_engine.runner.lora.num_slot_loads >= 2, "the one slot changed hands"


def test_a_bad_adapter_fails_its_request_only(case, llm, tmp_path):
    base, prompts, refs, adapters = case
    missing = LoRARequest("missing", 9, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="does not exist"):
        llm.generate([{"prompt_token_ids": prompts[0]}] * 2, _greedy(), use_tqdm=False, lora_request=[None, missing])
    with pytest.raises(ValueError, match="lora_int_id 1 is already used"):
        llm.generate({"prompt_token_ids": prompts[0]}, _greedy(), use_tqdm=False,
                     lora_request=LoRARequest("other", 1, adapters["wide"].lora_path))
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate({"prompt_token_ids": prompts[0]}, _greedy(), use_tqdm=False, lora_request=[None, None])
    out = llm.generate({"prompt_token_ids": prompts[1]}, _greedy(), use_tqdm=False, lora_request=adapters["small"])
    assert _tokens(out) == [refs["small"][1]]


def test_lora_requests_need_enable_lora(case):
    base, prompts, _, adapters = case
    llm = LLM(model=base, dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.generate({"prompt_token_ids": prompts[0]}, _greedy(), use_tqdm=False, lora_request=adapters["small"])


def test_samples_and_beams_keep_their_adapter(case, llm):
    """n > 1 children fork the parent's blocks, beams are requests of their own: all keep the
    adapter (greedy samples, and a beam of width 1, reproduce the adapter's greedy tokens)."""
    from folio import BeamSearchParams

    _, prompts, refs, adapters = case
    params = SamplingParams(n=2, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    (out,) = llm.generate({"prompt_token_ids": prompts[1]}, params, use_tqdm=False, lora_request=adapters["wide"])
    assert [c.token_ids for c in out.outputs] == [refs["wide"][1]] * 2
    (beams,) = llm.beam_search([{"prompt_token_ids": prompts[2]}], BeamSearchParams(beam_width=1, max_tokens=MAX_NEW,
                               ignore_eos=True), lora_request=adapters["small"])
    assert beams.sequences[0].tokens[len(prompts[2]):] == refs["small"][2]


def test_gate_up_delta_fused_into_the_activation_matches_peft(case, monkeypatch):
    """The CUDA path of the gate/up layers (shrink, then the delta added inside SiLU-and-mul:
    kernels/lora_silu_and_mul.py) run through the Triton interpreter on the CPU, in a batch that
    mixes the base model and both adapters: PEFT's tokens."""
    import folio.lora.layers as layers

    calls = []
    fused = layers.lora_silu_and_mul_triton
    monkeypatch.setattr(layers, "use_triton_for", lambda x: True)
    monkeypatch.setattr(layers, "lora_silu_and_mul_triton", lambda *a: (calls.append(1), fused(*a))[1])
    base, prompts, refs, adapters = case
    llm = _llm(base)
    names = ["base", "small", "wide"]
    requests = [None, adapters["small"], adapters["wide"]]
    prompt_dicts = [{"prompt_token_ids": p} for p in prompts for _ in names]
    got = _tokens(llm.generate(prompt_dicts, _greedy(), use_tqdm=False, lora_request=requests * len(prompts)))
    assert got == [refs[name][i] for i in range(len(prompts)) for name in names]
    assert calls  # the fused kernel ran


@pytest.mark.parametrize("kernels", [False, True])
def test_stacked_a_under_the_base_weight_matches_peft(case, monkeypatch, kernels):
    """Every slot's A stacked under the base weight (lora/layers.py; forced here, since these tiny
    layers are narrower than the automatic rule allows): one GEMM for the base output and the
    shrinks, then the stacked expand / fused activation, in the torch reference and (kernels)
    through the Triton interpreter, in a batch mixing the base model and both adapters."""
    import folio.lora.layers as layers

    monkeypatch.setenv("FOLIO_LORA_STACKED", "1")
    calls = []
    if kernels:
        monkeypatch.setattr(layers, "use_triton_for", lambda x: True)
        stacked = layers.lora_expand_stacked_triton
        monkeypatch.setattr(layers, "lora_expand_stacked_triton", lambda *a: (calls.append(1), stacked(*a))[1])
    base, prompts, refs, adapters = case
    llm = _llm(base)
    wrappers = llm.llm_engine.runner.lora.layers.values()
    assert wrappers and all(w.stacked_weight is not None for w in wrappers)
    names = ["base", "small", "wide"]
    requests = [None, adapters["small"], adapters["wide"]]
    prompt_dicts = [{"prompt_token_ids": p} for p in prompts for _ in names]
    got = _tokens(llm.generate(prompt_dicts, _greedy(), use_tqdm=False, lora_request=requests * len(prompts)))
    assert got == [refs[name][i] for i in range(len(prompts)) for name in names]
    assert bool(calls) == kernels
