"""On a GPU: the fast path (Triton kernels, CUDA graphs) computes what the plain torch path does.

- float32: greedy tokens of the Triton path with CUDA graphs equal those of the torch reference
  path (torch attention, torch layers, eager) on the tiny checkpoints, prompts alone and batched;
- bfloat16: the Triton path's logits are as close to float32 as plain torch's bf16 logits are;
- CUDA graphs: replayed decode steps give the eager steps' tokens, also when the batch is padded.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from folio import LLM, SamplingParams
from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.engine.arg_utils import EngineArgs
from folio.kernels.triton_compat import set_triton_kernels
from folio.worker.model_runner import ModelRunner
from tests.helpers.checkpoints import make_tiny_checkpoint

pytestmark = pytest.mark.gpu

KINDS = ["llama", "llama3", "mistral", "qwen2", "qwen2_swa", "qwen3", "opt"]
PROMPT_LENGTHS = [1, 5, 16, 17, 40, 101, 130, 200]
MAX_NEW = 24
NUM_BLOCKS = 512


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=KINDS)
def checkpoint(request, tmp_path_factory):
    return make_tiny_checkpoint(request.param, str(tmp_path_factory.mktemp(request.param)))


def _greedy(path: str, prompts: list[list[int]], *, fast: bool, dtype: str = "float32", batched: bool = True, **kwargs) -> list[list[int]]:
    previous = set_triton_kernels(fast)
    enforce_eager = kwargs.pop("enforce_eager", not fast)
    try:
        llm = LLM(
            model=path,
            device="cuda",
            dtype=dtype,
            num_gpu_blocks_override=NUM_BLOCKS,
            max_num_seqs=16,
            attention_backend="triton" if fast else "torch",
            enforce_eager=enforce_eager,
            **kwargs,
        )
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        token_prompts = [{"prompt_token_ids": p} for p in prompts]
        if batched:
            outputs = llm.generate(token_prompts, params, use_tqdm=False)
        else:
            outputs = [llm.generate([p], params, use_tqdm=False)[0] for p in token_prompts]
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        set_triton_kernels(previous)
        llm = None
        gc.collect()
        torch.cuda.empty_cache()


def test_float32_greedy_tokens_equal_the_torch_path(checkpoint):
    prompts = _prompts(0)
    reference = _greedy(checkpoint, prompts, fast=False)
    assert _greedy(checkpoint, prompts, fast=True) == reference
    assert _greedy(checkpoint, prompts[:3], fast=True, batched=False) == reference[:3]
    # A small token budget: chunked prefill mixed with decodes (eager mixed steps, graph decodes).
    assert _greedy(checkpoint, prompts, fast=True, max_num_batched_tokens=64) == reference


def test_cuda_graphs_give_the_eager_tokens(checkpoint):
    prompts = _prompts(1)[:5]  # 5 sequences replay the graph of 8: padded
    eager = _greedy(checkpoint, prompts, fast=True, dtype="bfloat16", enforce_eager=True)
    assert _greedy(checkpoint, prompts, fast=True, dtype="bfloat16") == eager


def test_float32_chunk_graphs_give_the_torch_path_tokens(checkpoint, monkeypatch):
    """Prompts of 17-200 tokens alone (more than the per-token graphs' 16 here) replay chunk
    graphs, padded, and give the torch reference path's greedy tokens; so does a prompt that
    joins a running request (its chunk beside the other's decode)."""
    from folio.worker.cuda_graphs import CudaGraphRunner

    replays = []
    replay = CudaGraphRunner.replay_chunk
    monkeypatch.setattr(CudaGraphRunner, "replay_chunk", lambda self, key: (replays.append(key), replay(self, key))[1])
    prompts = _prompts(3)[3:]
    reference = _greedy(checkpoint, prompts, fast=False, batched=False)
    assert _greedy(checkpoint, prompts, fast=True, batched=False) == reference
    assert sorted(replays) == [(32, 0), (64, 0), (128, 0), (256, 0), (256, 0)], replays
    replays.clear()
    previous = set_triton_kernels(True)
    try:
        llm = LLM(model=checkpoint, device="cuda", dtype="float32", num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=16,
                  attention_backend="triton")
        engine, done = llm.llm_engine, {}
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        engine.add_request("a", {"prompt_token_ids": prompts[0]}, params)
        for _ in range(3):
            engine.step()
        engine.add_request("b", {"prompt_token_ids": prompts[4]}, params)
        while engine.has_unfinished_requests():
            done.update((o.request_id, list(o.outputs[0].token_ids)) for o in engine.step() if o.finished)
    finally:
        set_triton_kernels(previous)
    assert (done["a"], done["b"]) == (reference[0], reference[4])
    assert replays[-1][1] >= 1, replays  # "b"'s 200 tokens beside "a"'s decode


def test_chunk_graphs_equal_the_eager_step_on_the_gluon_kernel(tmp_path):
    """A bf16 model with head_dim 128 (the Gluon prefill on Hopper): a 700-token prompt chunk, then
    the next 300 tokens on its cached 700 beside two decodes, then another request's 255-token
    prompt beside them (257 tokens: over the per-token graphs), replay the (768, 0), (512, 7) and
    (256, 7) chunk graphs (8 sequences: the captures took the Gluon kernel, which the eager
    300-token step takes too and the eager 255-token one does not: under 256 tokens it takes the
    mixed kernel); their hidden states equal the eager steps' within bf16 rounding (cuBLAS may
    tile the padded GEMMs differently), the padded rows stay out of the cache."""
    path = make_tiny_checkpoint("qwen3", tmp_path / "q", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=128, max_position_embeddings=4096)
    args = EngineArgs(model=path, dtype="bfloat16", device="cuda", num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=16)
    runner = ModelRunner(args.create_engine_config())
    runner.initialize_kv_cache(NUM_BLOCKS)
    assert runner.graphs is not None and {(768, 0), (512, 7)} <= set(runner.graphs.chunk_graphs)
    rng = random.Random(4)
    prompt = [rng.randrange(3, 1000) for _ in range(1000)]
    blocks = list(range(100, 100 + 1000 // 16 + 1))
    short, short_blocks = [rng.randrange(3, 1000) for _ in range(255)], list(range(30, 46))
    # Two running requests, each decoding its next token on 39 / 20 cached ones (whatever the
    # cache holds there: both modes read the same).
    decoders = [(Request(f"d{i}", [rng.randrange(3, 1000) for _ in range(n + 1)], SamplingParams(max_tokens=4)), n, b)
                for i, (n, b) in enumerate(((39, [10, 11, 12]), (20, [20, 21])))]
    replays = []
    replay = runner.graphs.replay_chunk
    runner.graphs.replay_chunk = lambda size: (replays.append(size), replay(size))[1]
    hidden = {}
    for graphs in (False, True):
        request = Request(f"r{graphs}", prompt, SamplingParams(max_tokens=1))
        other = Request(f"s{graphs}", short, SamplingParams(max_tokens=1))
        if not graphs:
            runner._chunk_bucket = lambda so: None
        else:
            del runner._chunk_bucket
        states = []
        for req, start, n, beside in ((request, 0, 700, []), (request, 700, 300, decoders), (other, 0, 255, decoders)):
            table = blocks if req is request else short_blocks
            scheduled = [ScheduledRequest(req, start, n, table, start + n == len(req.prompt_token_ids))]
            scheduled += [ScheduledRequest(d, k, 1, b, False) for d, k, b in beside]
            step = SchedulerOutput(scheduled, n + len(beside))
            with torch.inference_mode():
                states.append(runner.launch_forward(step).hidden[: n + len(beside)].float().clone())
        hidden[graphs] = torch.cat(states)
        assert torch.isfinite(hidden[graphs]).all()
    assert replays == [(768, 0), (512, 7), (256, 7)]
    error = float((hidden[True] - hidden[False]).abs().max() / hidden[False].abs().max())
    assert error < 2e-2, error
    spare = torch.ones(NUM_BLOCKS, dtype=torch.bool)
    spare[blocks + short_blocks + [10, 11, 12, 20, 21]] = False
    assert not runner.kv_cache[:, :, spare.to(runner.kv_cache.device)].any()  # the zeroed cache, unwritten


def _prefill_logits(path: str, dtype: str, fast: bool) -> torch.Tensor:
    """Logits of every prompt position after one batched prefill step: [tokens, vocab] float32."""
    previous = set_triton_kernels(fast)
    try:
        args = EngineArgs(
            model=path,
            dtype=dtype,
            device="cuda",
            num_gpu_blocks_override=NUM_BLOCKS,
            enforce_eager=True,
            attention_backend="triton" if fast else "torch",
        )
        runner = ModelRunner(args.create_engine_config())
        runner.initialize_kv_cache(NUM_BLOCKS)
        scheduled, next_block = [], 0
        for i, prompt in enumerate(_prompts(2)):
            request = Request(f"r{i}", prompt, SamplingParams(max_tokens=1))
            num_blocks = -(-len(prompt) // 16)
            scheduled.append(ScheduledRequest(request, 0, len(prompt), list(range(next_block, next_block + num_blocks)), True))
            next_block += num_blocks
        step = SchedulerOutput(scheduled, sum(len(s.request.prompt_token_ids) for s in scheduled))
        with torch.inference_mode():
            inputs = runner.inputs.build(step, {})
            hidden = runner.model(inputs.input_ids, inputs.positions, inputs.attn_metadata)
            return runner.model.compute_logits(hidden[: inputs.num_tokens]).float()
    finally:
        set_triton_kernels(previous)


def test_bfloat16_logits_stay_within_bf16_tolerance_of_float32(checkpoint):
    exact = _prefill_logits(checkpoint, "float32", fast=False)
    triton_fp32 = _prefill_logits(checkpoint, "float32", fast=True)
    triton_bf16 = _prefill_logits(checkpoint, "bfloat16", fast=True)
    torch_bf16 = _prefill_logits(checkpoint, "bfloat16", fast=False)

    def rel(x: torch.Tensor) -> float:
        assert torch.isfinite(x).all()
        return float((x - exact).norm() / exact.norm())

    assert rel(triton_fp32) < 1e-5
    assert rel(triton_bf16) < 2e-2
    assert rel(triton_bf16) < 2 * rel(torch_bf16) + 1e-3, (rel(triton_bf16), rel(torch_bf16))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_decode_steps_never_synchronise_the_stream(tmp_path, async_scheduling):
    """A step waits for its sampled ids on an event recorded after their copy to the host
    (worker/pending_output.py), once per step; nothing synchronises the stream or the device
    (graph replay, batch building, sampling metadata, the LM head and the placeholder gather
    all queue without waiting)."""
    import warnings

    from folio.worker.pending_output import PendingOutput

    path = make_tiny_checkpoint("qwen3", str(tmp_path))
    llm = LLM(model=path, device="cuda", dtype="bfloat16", num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=16,
              async_scheduling=async_scheduling)
    engine = llm.llm_engine
    for i, prompt in enumerate(_prompts(3)[:5]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, SamplingParams(max_tokens=30, ignore_eos=True))
    for _ in range(3):  # prefill, then decodes
        engine.step()
    assert engine.runner.graphs is not None
    waits = []
    result = PendingOutput.result
    PendingOutput.result = lambda self: (waits.append(1), result(self))[1]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4):
                engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        PendingOutput.result = result
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert syncs == [], [str(w.message) for w in syncs]
    assert len(waits) == 4
