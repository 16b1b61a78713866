"""StepPlan's wire format (parallel/step_plan.py) without a process group: what rank 0's
send_step broadcasts, fed to a follower's receive, gives back the step, the graph to replay
(a decode bucket or a chunk graph's key) and the block moves."""

from __future__ import annotations

import pytest
import torch

from folio.parallel import step_plan


@pytest.fixture
def wire(monkeypatch):
    """broadcast as a queue: rank 0's tensors, in order, are what the follower's calls return."""
    sent: list[torch.Tensor] = []

    def broadcast(x: torch.Tensor) -> torch.Tensor:
        if receiving[0]:
            return sent.pop(0)
        sent.append(x.clone())
        return x

    receiving = [False]
    monkeypatch.setattr(step_plan, "broadcast", broadcast)
    return sent, receiving


@pytest.mark.parametrize(("bucket", "chunk"), [(None, None), (8, None), (None, (512, 0)), (None, (1024, 64))])
def test_a_step_round_trips(wire, bucket, chunk):
    sent, receiving = wire
    cpu = torch.device("cpu")
    tokens, seqs = 6, 3  # padded: 6 tokens, 3 sequences (the last empty)
    ids, pos, slots = torch.arange(6) + 10, torch.arange(6), torch.tensor([4, 5, 6, 7, -1, -1])
    qsl, seq_lens = torch.tensor([0, 3, 4, 4], dtype=torch.int32), torch.tensor([9, 2, 0], dtype=torch.int32)
    tables = torch.arange(6, dtype=torch.int32).view(3, 2)
    moves = (((1, 2),), ((3, 4), (5, 6)), ())
    step_plan.send_step(cpu, (ids, pos, slots, qsl, seq_lens, tables), (4, seqs, 3, 9, False, bucket, chunk),
                        [torch.tensor([2, 3])], moves)
    receiving[0] = True
    plan = step_plan.receive(cpu)
    assert not sent and plan is not None
    assert (plan.num_tokens, plan.padded_seqs, plan.max_query_len, plan.max_seq_len) == (4, seqs, 3, 9)
    assert (plan.bucket, plan.chunk) == (bucket, chunk)
    assert plan.input_ids.tolist() == ids.tolist() and plan.slot_mapping.tolist() == slots.tolist()
    assert plan.input_ids.shape[0] == tokens and plan.query_start_loc_cpu == [0, 3, 4, 4]
    assert plan.seq_lens_cpu == [9, 2, 0] and plan.block_tables.tolist() == tables.tolist()
    assert [r.tolist() for r in plan.logit_sets] == [[2, 3]]
    assert (plan.blocks_to_copy, plan.blocks_to_swap_out, plan.blocks_to_swap_in) == ([(1, 2)], [(3, 4), (5, 6)], [])


def test_stop(wire):
    sent, receiving = wire
    step_plan.send_stop(torch.device("cpu"))
    receiving[0] = True
    assert step_plan.receive(torch.device("cpu")) is None


def test_a_follower_without_the_named_chunk_graph_runs_the_padded_step_eagerly(caplog):
    """Ranks configured differently (FOLIO_CHUNK_GRAPH_*): the follower runs rank 0's padded step
    through the model (the same collectives), replays what it has, and says so once."""
    from types import SimpleNamespace

    from folio.parallel.follower import Follower
    from folio.worker.step_inputs import StepInputBuilder

    calls = []

    class Model:
        def __call__(self, ids, positions, md):  # noqa: ANN001, ANN204
            calls.append(("eager", ids.shape[0], md.num_seqs))
            return torch.zeros(ids.shape[0], 4)

        def compute_logits(self, rows):  # noqa: ANN001, ANN201
            calls.append(("logits", rows.shape[0]))

    def replay_chunk(key):  # noqa: ANN001, ANN202
        calls.append(("replay", key))
        return torch.zeros(16, 4)

    graphs = SimpleNamespace(chunk_graphs={(16, 0): object()}, replay_chunk=replay_chunk)
    runner = SimpleNamespace(device=torch.device("cpu"), graphs=graphs, model=Model(), kv_cache=None,
                             inputs=StepInputBuilder(64, 8, 64, 4, torch.device("cpu")))
    follower = Follower(runner)  # type: ignore[arg-type]

    def plan(chunk):  # noqa: ANN001, ANN202 - a 5-token chunk padded to 16 tokens
        return step_plan.StepPlan(
            num_tokens=5, padded_seqs=1, max_query_len=5, max_seq_len=5, is_decode_only=False, bucket=None,
            input_ids=torch.arange(16), positions=torch.arange(16), slot_mapping=torch.full((16,), -1),
            query_start_loc=torch.tensor([0, 5]), seq_lens=torch.tensor([5]),
            block_tables=torch.zeros(1, 2, dtype=torch.int64),
            query_start_loc_cpu=[0, 5], seq_lens_cpu=[5], logit_sets=[torch.tensor([4])], chunk=chunk)

    with caplog.at_level("WARNING"):
        for chunk in ((32, 0), (32, 0), (16, 0)):
            follower.step(plan(chunk))
    assert calls == [("eager", 16, 1), ("logits", 1)] * 2 + [("replay", (16, 0)), ("logits", 1)]
    assert sum("did not capture" in r.message for r in caplog.records) == 1
