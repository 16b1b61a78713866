"""Speculative decoding end to end on the tiny checkpoints: greedy outputs are those of the
engine without speculation (n-gram, a draft of another architecture, draft = target), batched,
one by one and preempted (recompute and swap); stop strings, max_tokens, penalties and
logprobs exact; seeded sampling repeatable; n > 1; beams untouched."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from folio.engine.metrics import EngineMetrics
from folio.sampling_params import BeamSearchParams
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hello, my name is",
    "a b c a b c a b c a b",
    {"prompt_token_ids": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]},
    "The capital of France is",
]
GREEDY = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
SMALL_CACHE = dict(num_gpu_blocks_override=14, block_size=4, max_model_len=48, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    out = {}
    for kind in ("llama", "qwen3"):
        path = tiny_model_dir(tmp_path_factory, kind)
        out[kind] = path
    return out


def _spec(paths, method: str, k: int = 3) -> dict:
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    return {"model": paths["qwen3" if method == "draft-other" else "llama"], "num_speculative_tokens": k}


def _llm(paths, spec: dict | None = None, **kwargs) -> LLM:
    kwargs = {"max_model_len": 64, **kwargs}
    return LLM(model=paths["llama"], dtype="float32", device="cpu", seed=0, speculative_config=spec, **kwargs)


def _summary(outputs):
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]


def _spy_on_step_layouts(monkeypatch) -> list[bool]:
    """Record, for each step the runner builds, whether its attention ran per token."""
    from folio.worker.step_inputs import StepInputBuilder

    layouts: list[bool] = []
    build = StepInputBuilder.build

    def spy(self, *args, per_token_seqs=False, **kwargs):
        layouts.append(per_token_seqs)
        return build(self, *args, per_token_seqs=per_token_seqs, **kwargs)

    monkeypatch.setattr(StepInputBuilder, "build", spy)
    return layouts


@pytest.fixture(scope="module")
def baseline(paths):
    return _llm(paths)


@pytest.mark.parametrize("method", ["ngram", "draft-other", "draft-same"])
def test_greedy_outputs_are_unchanged_batched_and_one_by_one(paths, baseline, method, monkeypatch):
    want = baseline.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm = _llm(paths, _spec(paths, method))
    layouts = _spy_on_step_layouts(monkeypatch)
    assert _summary(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == _summary(want)
    for prompt, expected in zip(PROMPTS[:2], want):
        assert _summary(llm.generate(prompt, GREEDY, use_tqdm=False)) == _summary([expected])
    engine = llm.llm_engine
    stats = engine.scheduler.spec_stats
    assert stats.num_draft_tokens > 0
    assert layouts.count(True) > 0  # verify steps ran as one decode sequence per token
    if method == "draft-same":
        assert stats.acceptance_rate > 0.9  # the draft is the target: (almost) every draft holds
        metrics = EngineMetrics("m")
        metrics.record_stats(engine.stats())
        text = metrics.render().decode()
        assert f'folio:spec_decode_num_accepted_tokens_total{{model_name="m"}} {float(stats.num_accepted_tokens)}' in text
        assert 'folio:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"}' in text
    assert engine.stats().num_free_blocks == engine.stats().num_blocks  # every slot given back


@pytest.fixture(scope="module")
def small_cache_want(paths):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return params, _llm(paths, **SMALL_CACHE).generate(PROMPTS, params, use_tqdm=False)


@pytest.mark.parametrize(
    "method, mode", [("ngram", "recompute"), ("draft-same", "swap"), ("draft-other", "recompute")]
)
def test_greedy_outputs_are_unchanged_under_preemption(paths, small_cache_want, method, mode):
    params, want = small_cache_want
    llm = _llm(paths, _spec(paths, method), preemption_mode=mode, **SMALL_CACHE)
    got = llm.generate(PROMPTS, params, use_tqdm=False)
    assert _summary(got) == _summary(want)
    engine = llm.llm_engine
    assert engine.stats().num_preemptions > 0
    if mode == "swap":
        assert engine.stats().num_swap_preemptions > 0
    assert engine.scheduler.spec_stats.num_draft_tokens > 0
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_stop_strings_max_tokens_penalties_and_logprobs_are_exact(paths, baseline):
    """draft = target accepts k tokens a step, so stops land inside accepted runs."""
    ref, _, ref2, _ = [o.outputs[0] for o in baseline.generate(PROMPTS, GREEDY, use_tqdm=False)]
    stop_text = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 2]  # ends the output mid-run
    params = [
        SamplingParams(temperature=0, max_tokens=20, stop=[stop_text]),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),  # not a multiple of k + 1
        SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ref2.token_ids[5]], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.4, presence_penalty=0.5, min_tokens=3),
    ]
    want = baseline.generate(PROMPTS, params, use_tqdm=False)
    assert want[0].outputs[0].finish_reason == "stop" and want[2].outputs[0].finish_reason == "stop"
    llm = _llm(paths, _spec(paths, "draft-same"))
    got = llm.generate(PROMPTS, params, use_tqdm=False)
    assert _summary(got) == _summary(want)
    assert len(got[1].outputs[0].token_ids) == 7
    logprobs = SamplingParams(temperature=0, max_tokens=9, logprobs=2, ignore_eos=True)
    [a] = llm.generate(PROMPTS[1], logprobs, use_tqdm=False)
    [b] = baseline.generate(PROMPTS[1], logprobs, use_tqdm=False)
    for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
        assert x.keys() == y.keys()
        assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 and x[t].rank == y[t].rank for t in x)


def test_seeded_sampling_repeats_and_n_samples(paths, baseline):
    llm = _llm(paths, _spec(paths, "draft-same"))
    seeded = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=11, max_tokens=12, ignore_eos=True)
    first = llm.generate(PROMPTS[:2], seeded, use_tqdm=False)
    again = llm.generate(PROMPTS[:2], seeded, use_tqdm=False)
    assert _summary(first) == _summary(again)
    assert all(len(o.outputs[0].token_ids) == 12 for o in first)
    n_greedy = SamplingParams(temperature=0, n=3, max_tokens=10, ignore_eos=True)
    [got] = llm.generate(PROMPTS[1], n_greedy, use_tqdm=False)
    [want] = baseline.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    assert [c.token_ids for c in got.outputs] == [want.outputs[0].token_ids] * 3
    llm.llm_engine.runner.speculator.disable_by_batch_size = 2  # as speculative_config sets it
    drafts = llm.llm_engine.scheduler.spec_stats.num_drafts
    batched = llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
    assert llm.llm_engine.scheduler.spec_stats.num_drafts == drafts  # 3 requests: no drafts
    assert _summary(batched) == _summary(baseline.generate(PROMPTS[:3], GREEDY, use_tqdm=False))
    beams = BeamSearchParams(beam_width=2, max_tokens=5)
    prompt = [{"prompt_token_ids": [3, 4, 5, 6]}]
    assert [b.tokens for b in llm.beam_search(prompt, beams)[0].sequences] == [
        b.tokens for b in baseline.beam_search(prompt, beams)[0].sequences
    ]


def test_drafting_pauses_while_verify_steps_would_outgrow_the_graphs(paths, baseline, caplog, monkeypatch):
    """With decode graphs of at most 8 tokens (as capture sets it on a GPU) and k = 3, a batch of
    3 requests (12 verify tokens) gets no drafts and a batch of 2 (8 tokens) does; the pause and
    the resumption are logged, and outputs stay those of the engine without speculation. While
    paused the draft model skips the batch (its requests become stale and finish without
    drafts), so a paused speculator costs no draft forwards; new requests draft again."""
    llm = _llm(paths, _spec(paths, "draft-same"))
    speculator = llm.llm_engine.runner.speculator
    speculator.max_graph_tokens = 8
    stats = llm.llm_engine.scheduler.spec_stats
    mirrored = []
    mirror = speculator.proposer._mirror
    monkeypatch.setattr(speculator.proposer, "_mirror", lambda inputs: (mirrored.append(1), mirror(inputs)))
    import folio.core.scheduler as scheduler_module

    reserved: dict[str, list[int]] = {}  # request id -> lookahead slots reserved at each schedule
    lookahead = scheduler_module.lookahead_slots

    def spy(request, *args):
        reserved.setdefault(request.request_id, []).append(n := lookahead(request, *args))
        return n

    monkeypatch.setattr(scheduler_module, "lookahead_slots", spy)
    with caplog.at_level("INFO", logger="folio.spec_decode.speculator"):
        batched = llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
        assert stats.num_drafts == 0 and not mirrored
        assert speculator.stale == {o.request_id for o in batched}
        # Stale requests stop reserving lookahead slots (at most the step planned before the
        # update that reported them); each was scheduled for (nearly) every token.
        assert all(sum(1 for n in reserved[o.request_id] if n) <= 2 for o in batched), reserved
        assert all(len(reserved[o.request_id]) >= GREEDY.max_tokens - 1 for o in batched), reserved
        pair = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert stats.num_drafts > 0 and mirrored
    assert all(any(reserved[o.request_id]) for o in pair)  # drafting requests do reserve them
    assert not speculator.stale  # finished requests are forgotten (at the next step)
    assert "Speculative decoding paused: 3 requests (3 drafting 3 tokens) verify 12 tokens, more than" in caplog.text
    assert "the draft model skips the batch, whose requests finish without drafts" in caplog.text
    # The stale batch of 3 verifies 3 tokens a step: the pause ends, and nothing drafts.
    assert "Speculative decoding resumed: 3 requests (0 drafting 3 tokens) verify 3 tokens, within" in caplog.text
    assert _summary(batched) == _summary(baseline.generate(PROMPTS[:3], GREEDY, use_tqdm=False))
    assert _summary(pair) == _summary(baseline.generate(PROMPTS[:2], GREEDY, use_tqdm=False))


@pytest.mark.parametrize("method", ["ngram", "draft-same"])
def test_paused_steps_run_ahead_and_drafting_resumes_when_the_batch_shrinks(paths, baseline, method, monkeypatch):
    """disable_by_batch_size = 3 and 4 requests, two of them short: while 3 or more run, the
    speculator is paused and the engine launches each step before the previous one's tokens are
    on the host (async scheduling, as without speculation); once two have finished, n-gram drafting
    resumes (a draft model's requests stayed stale, so it drafts for new ones only) and no step
    is launched ahead of a drafting or verifying one. Outputs stay those without speculation."""
    from folio.engine.llm_engine import LLMEngine

    llm = _llm(paths, {**_spec(paths, method), "disable_by_batch_size": 3})
    engine = llm.llm_engine
    ahead: list[tuple[bool, bool]] = []  # per finished step: (a step was launched ahead of it, it speculated)
    finish = LLMEngine._finish_step

    def spy(self, scheduler_output, runner_output):
        drafted = bool(runner_output.spec_token_ids and any(map(len, runner_output.spec_token_ids)))
        verified = any(len(s.spec_token_ids) for s in scheduler_output.scheduled)
        ahead.append((self._in_flight is not None, drafted or verified))
        return finish(self, scheduler_output, runner_output)

    monkeypatch.setattr(LLMEngine, "_finish_step", spy)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 3, 14, 14)]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert _summary(outputs) == _summary(baseline.generate(PROMPTS, params, use_tqdm=False))
    assert any(launched for launched, _ in ahead[:3])  # the paused steps ran ahead
    stats = engine.scheduler.spec_stats
    if method == "ngram":
        assert stats.num_drafts > 0 and any(speculated for _, speculated in ahead)
    else:
        assert stats.num_drafts == 0  # the batch went stale while paused
        assert _summary(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)) == _summary(
            baseline.generate(PROMPTS[:2], GREEDY, use_tqdm=False))
        assert stats.num_drafts > 0
    assert not any(launched and speculated for launched, speculated in ahead)  # nothing ran ahead of those


def test_a_step_launched_ahead_never_verifies_drafts_behind_an_inflight_token(paths, baseline):
    """n-gram, a 2-token budget: a request cut to one token samples a placeholder while the
    drafts of an earlier step are still on it; a step launched ahead of that one must not
    schedule those drafts after the placeholder (it crashed the step build: "a placeholder in a
    2-token chunk"). Found by a review's random search; outputs stay those without speculation."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = _llm(paths, spec, max_num_batched_tokens=2, max_num_seqs=2)
    prompts = [{"prompt_token_ids": [7, 46, 24, 33, 38, 9, 25]}, {"prompt_token_ids": [23, 42, 43, 16, 38]}]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 20)]
    assert _summary(llm.generate(prompts, params, use_tqdm=False)) == _summary(
        baseline.generate(prompts, params, use_tqdm=False))


@pytest.mark.parametrize("method", ["ngram", "draft-same"])
def test_random_small_budgets_keep_outputs_exact(paths, baseline, method):
    """Seeded random pairs of requests under 2-4-token budgets and 2 sequences (chunked prompts,
    requests cut to one token beside others' drafts, steps launched ahead), a draft model also
    paused now and then (a small graph limit): greedy outputs equal those without speculation."""
    import random

    rng = random.Random(7)
    for trial in range(8):
        budget = rng.randrange(2, 5)
        llm = _llm(paths, {**_spec(paths, method), "prompt_lookup_min": 1} if method == "ngram" else _spec(paths, method),
                   max_num_batched_tokens=budget, max_num_seqs=2)
        if method != "ngram":
            llm.llm_engine.runner.speculator.max_graph_tokens = rng.choice([None, 4, 6])
        prompts = [{"prompt_token_ids": [rng.randrange(3, 50) for _ in range(rng.randrange(2, 8))]} for _ in range(2)]
        params = [SamplingParams(temperature=0, max_tokens=rng.randrange(2, 14), ignore_eos=True) for _ in range(2)]
        got = llm.generate(prompts, params, use_tqdm=False)
        assert _summary(got) == _summary(baseline.generate(prompts, params, use_tqdm=False)), (trial, budget)
