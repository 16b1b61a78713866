"""The rank slicing rules without processes: each rank's QKV/embedding slice of a checkpoint
equals the matching part of the whole tensor, read through safetensors' get_slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import folio.layers.linear as linear_mod
import folio.layers.vocab_embedding as vocab_mod
from folio.config import ParallelConfig
from folio.layers.checkpoint_slice import CheckpointSlice
from folio.layers.linear import QKVLinear, RowParallelLinear
from folio.layers.vocab_embedding import VocabEmbedding
from folio.parallel import rendezvous


def _as_rank(monkeypatch, rank: int, size: int) -> None:
    for module in (linear_mod, vocab_mod):
        monkeypatch.setattr(module, "get_tp_rank", lambda: rank)
        monkeypatch.setattr(module, "get_tp_size", lambda: size)


def _slice_of(tensor: torch.Tensor, tmp_path) -> CheckpointSlice:
    from safetensors import safe_open

    save_file({"t": tensor}, str(tmp_path / "t.safetensors"))
    source = safe_open(str(tmp_path / "t.safetensors"), framework="pt").get_slice("t")
    return CheckpointSlice(source, tuple(source.get_shape()))


@pytest.mark.parametrize("tp,kv_heads", [(2, 2), (4, 2), (4, 1), (2, 4)])
def test_qkv_rank_holds_the_kv_heads_its_query_heads_read(monkeypatch, tmp_path, tp, kv_heads) -> None:
    heads, dim, hidden = 8, 3, 5
    q, k, v = (torch.randn(n * dim, hidden) for n in (heads, kv_heads, kv_heads))
    group = heads // kv_heads  # query heads per KV head
    for rank in range(tp):
        _as_rank(monkeypatch, rank, tp)
        layer = QKVLinear(hidden, dim, heads, kv_heads)
        for shard, tensor in zip("qkv", (q, k, v)):
            layer.weight_loader(layer.weight, _slice_of(tensor, tmp_path), shard)
        wq, wk, _ = layer.weight.split(layer.output_partition_sizes)
        my_heads = range(rank * heads // tp, (rank + 1) * heads // tp)
        assert torch.equal(wq, q.view(heads, dim, hidden)[list(my_heads)].reshape(-1, hidden))
        kv_of = sorted({h // group for h in my_heads})
        assert layer.num_kv_heads_per_rank == len(kv_of)
        assert torch.equal(wk, k.view(kv_heads, dim, hidden)[kv_of].reshape(-1, hidden))


def test_row_parallel_reads_its_input_columns(monkeypatch, tmp_path) -> None:
    w = torch.randn(4, 6)
    _as_rank(monkeypatch, 1, 2)
    layer = RowParallelLinear(6, 4)
    layer.weight_loader(layer.weight, _slice_of(w, tmp_path))
    assert torch.equal(layer.weight, w[:, 3:])


def test_vocab_rows_padded_to_a_multiple_of_tp(monkeypatch, tmp_path) -> None:
    table = torch.randn(7, 2)  # 7 rows over 2 ranks: 4 each, the last rank's 4th row is padding
    _as_rank(monkeypatch, 1, 2)
    emb = VocabEmbedding(7, 2)
    emb.weight_loader(emb.weight, _slice_of(table, tmp_path))
    assert emb.weight.shape == (4, 2) and emb.row_start == 4
    assert torch.equal(emb.weight[:3], table[4:]) and not emb.weight[3].any()


def test_uneven_heads_are_a_clear_error(monkeypatch) -> None:
    _as_rank(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match="6 attention heads do not divide over 4"):
        QKVLinear(12, 2, 6, 2)
    with pytest.raises(ValueError, match="3 KV heads cannot be split or replicated evenly over 4"):
        QKVLinear(12, 2, 12, 3)


def test_heads_that_do_not_split_are_refused_before_any_worker_starts(tmp_path_factory) -> None:
    # Found by a review: tensor_parallel_size=64 spawned 64 workers (~100 s) before each failed.
    from folio.engine.arg_utils import EngineArgs
    from tests.helpers.checkpoints import tiny_model_dir

    path = tiny_model_dir(tmp_path_factory, "llama", "tp-heads")
    heads = json.loads((Path(path) / "config.json").read_text())["num_attention_heads"]
    with pytest.raises(ValueError, match=f"{heads} attention heads do not divide over {heads * 16}"):
        EngineArgs(model=path, tensor_parallel_size=heads * 16, device="cpu").create_engine_config()


def test_parallel_config_validation() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive"):
        ParallelConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="nnodes must be a positive divisor"):
        ParallelConfig(tensor_parallel_size=4, nnodes=3, master_addr="10.0.0.1")
    with pytest.raises(ValueError, match="need master_addr"):
        ParallelConfig(tensor_parallel_size=4, nnodes=2)
    with pytest.raises(ValueError, match="distributed_executor_backend"):
        ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="ray")
    assert list(ParallelConfig(tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="h").local_ranks) == [2, 3]


def test_rendezvous_reads_torchrun_variables(monkeypatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29511")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    r = rendezvous.resolve(ParallelConfig(tensor_parallel_size=4))
    assert (r.master_addr, r.master_port, r.world_size, r.rank) == ("10.1.2.3", 29511, 4, 2)


def test_one_node_picks_a_free_port(monkeypatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    ports = {rendezvous.resolve(ParallelConfig(tensor_parallel_size=2)).master_port for _ in range(3)}
    assert all(0 < p < 65536 for p in ports)
