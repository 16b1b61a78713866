"""LLM.beam_search equals transformers' generate(num_beams=W, do_sample=False, length_penalty=lp)
(default early_stopping=False): the same W sequences in the same order, with the same scores,
including beams ended by EOS and the early stop; alone, batched, and with beams preempted."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch

from folio.engine.beam_search import BeamSearchParams
from tests.prefix.helpers import make_llm

pytestmark = pytest.mark.slow

MAX_NEW = 8


def _prompts() -> list[list[int]]:
    rng = random.Random(17)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 16, 37)]


def _hf_beams(path: str, prompt: list[int], width: int, lp: float, max_new: int = MAX_NEW):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        length_penalty=lp,
        max_new_tokens=max_new,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    seqs = []
    for row in out.sequences[:, len(prompt):].tolist():
        # transformers pads finished beams after their EOS; cut there.
        for i, tok in enumerate(row):
            if tok in eos:
                row = row[: i + 1]
                break
        seqs.append(row)
    return seqs, out.sequences_scores.tolist()


@pytest.fixture(scope="module")
def path(checkpoint, tmp_path_factory):
    """The tiny Llama with a second EOS token that its beams actually produce, so beams end
    early and the early-stop heuristic is exercised (both engines read generation_config)."""
    base = checkpoint("llama")
    path = str(tmp_path_factory.mktemp("beams"))
    shutil.copytree(base, path, dirs_exist_ok=True)
    seqs, _ = _hf_beams(base, _prompts()[0], 3, 1.0)
    frequent = seqs[0][2]  # the third token of the best beam
    from transformers import AutoTokenizer

    tok_eos = AutoTokenizer.from_pretrained(path).eos_token_id
    config_path = os.path.join(path, "generation_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["eos_token_id"] = sorted({tok_eos, frequent})
    with open(config_path, "w") as f:
        json.dump(config, f)
    return path


@pytest.mark.parametrize("width", [2, 3, 4])  # num_beams=1 is greedy search there
@pytest.mark.parametrize("lp", [1.0, 0.0, 2.0])
def test_beams_equal_transformers(path, width, lp):
    llm = make_llm(path)
    prompts = _prompts()
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=width, max_tokens=MAX_NEW, length_penalty=lp))
    ended_by_eos = 0
    for prompt, out in zip(prompts, outs):
        seqs, scores = _hf_beams(path, prompt, width, lp)
        got = [s.tokens[len(prompt):] for s in out.sequences]
        assert got == seqs
        for s, score in zip(out.sequences, scores):
            length = len(s.tokens) - len(prompt)
            assert s.cum_logprob / length**lp == pytest.approx(score, abs=1e-4)
            assert s.tokens[: len(prompt)] == prompt
            ended_by_eos += s.finish_reason == "stop"
    if lp <= 1.0:  # (lp = 2 favours long beams over the short ones EOS ends)
        assert ended_by_eos > 0  # the EOS paths were taken
    stats = llm.llm_engine.stats()
    assert stats.num_free_blocks == stats.num_blocks and not llm.llm_engine.has_unfinished_requests()


def test_beams_share_blocks_and_survive_preemption(path):
    prompt = _prompts()[2]
    width = 4
    seqs, _ = _hf_beams(path, prompt, width, 1.0, max_new=24)
    params = BeamSearchParams(beam_width=width, max_tokens=24)
    roomy = make_llm(path)
    (out,) = roomy.beam_search([{"prompt_token_ids": prompt}], params)
    assert [s.tokens[len(prompt):] for s in out.sequences] == seqs
    stats = roomy.llm_engine.stats()
    assert stats.num_copied_blocks > 0  # forks copy the block they write next
    # 6 blocks of 16: the 4 beams (37 + 24 tokens each, 3 shared blocks) do not all fit.
    tight = make_llm(path, num_gpu_blocks_override=6, max_model_len=96)
    (out,) = tight.beam_search([{"prompt_token_ids": prompt}], params)
    assert [s.tokens[len(prompt):] for s in out.sequences] == seqs
    stats = tight.llm_engine.stats()
    assert stats.num_preemptions > 0 and stats.num_free_blocks == stats.num_blocks


def test_beam_search_output_shape_and_text(path):
    llm = make_llm(path)
    tok = llm.get_tokenizer()
    (out,) = llm.beam_search("Hello, my name is", BeamSearchParams(beam_width=2, max_tokens=5))
    assert len(out.sequences) == 2
    prompt_ids = tok.encode("Hello, my name is")
    for s in out.sequences:
        assert s.tokens[: len(prompt_ids)] == prompt_ids
        generated = s.tokens[len(prompt_ids):]
        if s.finish_reason == "stop":
            generated = generated[:-1]
        assert s.text == tok.decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert len(s.logprobs) == len(s.tokens) - len(prompt_ids)
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.beam_search("Hi", BeamSearchParams(beam_width=8, max_tokens=2))
