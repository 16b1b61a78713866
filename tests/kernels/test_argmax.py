"""The split argmax (folio/kernels/argmax.py) against torch.argmax: first index of the maximum,
NaN as the maximum, rows of -inf, ties across and within splits, every float dtype."""

import pytest
import torch

from folio.kernels.argmax import BLOCK, argmax_rows, argmax_split, choose_splits


def _check(logits: torch.Tensor, **kwargs) -> None:
    want = logits.float().cpu().argmax(dim=-1)
    got = argmax_split(logits, **kwargs)
    assert got.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got.cpu(), want), (got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "vocab", "splits"),
                         [(1, 5000, 4), (3, 2 * BLOCK + 1, 8), (2, 100, 1), (1, 4 * BLOCK, 2)])
def test_matches_torch_on_random_rows(device, dtype, rows, vocab, splits):
    gen = torch.Generator().manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab, generator=gen).to(device=device, dtype=dtype)
    _check(logits, splits=splits)


@pytest.mark.parametrize("splits", [1, 2, 8])
def test_ties_take_the_first_index(device, splits):
    """Equal maxima within one chunk, in two lanes of different chunks, and in different splits."""
    vocab = 3 * BLOCK + 7
    logits = torch.zeros(4, vocab)
    logits[0, [5, 9, BLOCK + 5]] = 3.0  # same chunk, then the same lane of the next chunk
    logits[1, [BLOCK + 2, 7]] = 2.0  # the later chunk's lane is lower: the index decides, not the lane
    logits[2, [vocab - 1, 2 * BLOCK]] = 1.0  # both in the last splits
    logits[3] = 0.5  # all equal: token 0
    _check(logits.to(device), splits=splits)


@pytest.mark.parametrize("splits", [1, 4])
def test_nan_and_minus_inf_rows_answer_as_torch(device, splits):
    vocab = 2 * BLOCK + 3
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    logits[0, [BLOCK + 9, 40]] = float("nan")  # the first NaN wins, whatever the other values
    logits[1] = float("-inf")  # torch answers 0
    logits[2] = float("-inf")
    logits[2, vocab - 1] = -1e30  # the only finite logit, in the last split
    logits[3, 3] = float("inf")
    logits[3, BLOCK] = float("inf")
    _check(logits.to(device), splits=splits)


def test_choose_splits_fills_the_gpu_without_empty_work():
    assert choose_splits(1, 128256, 132) == 64 and choose_splits(1, 151936, 132) == 64
    assert choose_splits(1, 3000, 132) == 2 and choose_splits(1, BLOCK, 132) == 1
    assert choose_splits(32, 151936, 132) == 8 and choose_splits(132, 151936, 132) == 2


def test_refuses_bad_input_by_name(device):
    with pytest.raises(ValueError, match="rows, vocab"):
        argmax_split(torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="power of two"):
        argmax_split(torch.zeros(1, 10, device=device), splits=128)
    with pytest.raises(ValueError, match="power of two"):
        argmax_split(torch.zeros(1, 10, device=device), splits=3)
    with pytest.raises(ValueError, match="empty"):
        argmax_split(torch.zeros(1, 0, device=device))
    assert argmax_split(torch.zeros(0, 10, device=device)).shape == (0,)


def test_dispatch_keeps_torch_on_the_cpu_and_for_big_batches():
    logits = torch.randn(2, 50)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "vocab"), [(1, 128256), (1, 151936), (7, 151936), (63, 32000)])
def test_full_size_and_under_graph_replays(rows, vocab):
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, vocab, generator=gen).cuda()
    _check(logits)
    assert torch.equal(argmax_rows(logits).cpu(), logits.cpu().argmax(dim=-1))  # torch past one row
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = argmax_rows(logits)
    for seed in range(3):
        logits.copy_(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured.cpu(), logits.cpu().argmax(dim=-1))



def test_warm_up_runs_the_batch_1_path_where_it_dispatches(monkeypatch):
    """warm_up sends one [1, vocab] row of the given dtype down argmax_rows: the kernels where a batch-1
    greedy step would take them (faked here: dispatch forced on, the launcher recorded), torch
    otherwise."""
    from folio.kernels import argmax

    seen = []
    monkeypatch.setattr(argmax, "argmax_split", lambda logits: seen.append((logits.shape, logits.dtype)) or None)
    argmax.warm_up(1000, torch.device("cpu"))
    assert seen == []  # the CPU: torch
    monkeypatch.setattr(argmax, "use_triton_for", lambda _x: True)
    argmax.warm_up(1000, torch.device("cpu"))
    argmax.warm_up(1000, torch.device("cpu"), torch.bfloat16)  # the sampler's logits are the model's dtype
    assert seen == [((1, 1000), torch.float32), ((1, 1000), torch.bfloat16)]
