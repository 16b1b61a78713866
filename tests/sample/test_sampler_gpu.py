"""The sampler on a CUDA device: no host waits, seeds independent of the batch, CPU agreement."""

from __future__ import annotations

import random

import pytest
import torch

from folio.sample import Sampler, SamplingMetadata
from folio.sampling_params import SamplingParams
from tests.sample.rows import CPU, decode_seeded, make_row, sample, step_logits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
VOCAB = 1000


def _every_feature(device: torch.device) -> list:
    eos = SamplingParams(min_tokens=4, stop_token_ids=[7], temperature=0.8, logprobs=3)
    eos.update_from_model({2})
    return [
        make_row(temperature=0.0, repetition_penalty=1.3, prompt=[1, 5, 9], device=device),
        make_row(eos, output=[3], device=device),
        make_row(temperature=0.7, top_k=20, top_p=0.9, seed=5, device=device),
        make_row(temperature=1.2, min_p=0.05, frequency_penalty=0.4, output=[4, 4], device=device),
        make_row(logit_bias={11: 4.0}, allowed_token_ids=list(range(50)), device=device),
        make_row(presence_penalty=1.0, output=[8], logprobs=5, seed=6, device=device),
    ]


def test_a_step_never_makes_the_host_wait_for_the_device():
    rows = _every_feature(CUDA)
    logits = step_logits(len(rows), VOCAB, 0, CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = sample(rows, logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.sampled_token_ids.device.type == "cuda"
    assert out.logprobs.shape == (len(rows), 6)


def test_greedy_and_logprobs_agree_with_the_cpu():
    rows_cpu, rows_gpu = _every_feature(CPU), _every_feature(CUDA)
    logits = step_logits(len(rows_cpu), VOCAB, 1)
    cpu = sample(rows_cpu, logits)
    gpu = sample(rows_gpu, logits.to(CUDA))
    assert cpu.sampled_token_ids[0] == gpu.sampled_token_ids[0].cpu()  # the greedy row
    gpu_ids = gpu.logprob_token_ids.cpu()
    assert torch.equal(cpu.logprob_token_ids[:, 1:], gpu_ids[:, 1:])
    torch.testing.assert_close(cpu.logprobs[:, 1:], gpu.logprobs.cpu()[:, 1:])


@pytest.mark.parametrize(
    "fields",
    [dict(temperature=0.9, top_k=30, seed=1), dict(temperature=0.8, top_p=0.9, seed=2**40)],
)
def test_seeded_row_ignores_the_rest_of_the_batch(fields):
    rng = random.Random(0)

    def crowd(step: int) -> list:
        others = [
            dict(temperature=0.0),
            dict(temperature=1.3, top_p=0.8),
            dict(temperature=0.6, seed=99),
            dict(presence_penalty=1.0, logit_bias={3: 2.0}),
        ]
        chosen = rng.sample(others, rng.randint(1, len(others)))
        return [make_row(**f, output=[step], device=CUDA) for f in chosen]

    alone = decode_seeded(fields, 16, lambda step: [], 0, VOCAB, CUDA)
    crowded = decode_seeded(fields, 16, crowd, 77, VOCAB, CUDA)
    assert crowded == alone
    assert len(set(alone)) > 1


def test_large_batches_draw_only_allowed_tokens():
    """Millions of noise values per step: a zero draw must not pick a zero-probability token."""
    rows, vocab = 256, 32000
    allowed = [5, 17, 31000]
    batch = [make_row(allowed_token_ids=allowed, temperature=1.5, device=CUDA)] * rows
    metadata = SamplingMetadata.build(batch, vocab, CUDA)
    sampler = Sampler(0, CUDA)
    noise = torch.Generator(device=CUDA).manual_seed(1)
    seen: set[int] = set()
    for _ in range(20):
        logits = torch.randn(rows, vocab, device=CUDA, generator=noise) * 3  # [rows, vocab]
        seen |= set(sampler(logits, metadata).sampled_token_ids.tolist())
    assert seen == set(allowed)
