"""Block sharing by fork: the n > 1 samples of a request, beams (pause, fork_request, parked),
and copy-on-write of the shared partial block. FakeModel checks every K/V read."""

from __future__ import annotations

import pytest

from folio.core.request import Request, RequestStatus
from tests.core.fakes import FakeModel, RunResult, make_request, make_scheduler, run_to_completion, step

BS = 4


def _family(prompt_len: int, n: int, max_tokens: int = 6) -> list[Request]:
    leader = make_request("0_x", prompt_len, max_tokens=max_tokens)
    leader.family_id = "x"
    children = [leader]
    for i in range(1, n):
        child = make_request(f"{i}_x", prompt_len, max_tokens=max_tokens)
        child.family_id, child.parent = "x", leader
        children.append(child)
    return children


def _first_shares(model: FakeModel) -> dict[str, tuple[int, int]]:
    first: dict[str, tuple[int, int]] = {}
    for out in model.steps:
        for s in out.scheduled:
            first.setdefault(s.request_id, (s.num_computed_tokens, s.num_new_tokens))
    return first


@pytest.mark.parametrize("prompt_len", [2, 9, 12, 13])
@pytest.mark.parametrize("caching", [False, True])
def test_samples_compute_the_prompt_once_and_copy_the_partial_block(prompt_len, caching):
    sched = make_scheduler(block_size=BS, enable_prefix_caching=caching)
    for r in _family(prompt_len, 4):
        sched.add_request(r)
    model = FakeModel(BS)
    result = run_to_completion(sched, model)
    reference = make_scheduler(block_size=BS)
    reference.add_request(make_request("solo", prompt_len, max_tokens=6))
    expected = run_to_completion(reference, FakeModel(BS)).outputs["solo"]
    assert all(result.outputs[f"{i}_x"] == expected for i in range(4))  # same tokens in, same out
    first = _first_shares(model)
    assert first["0_x"] == (0, prompt_len)
    assert all(first[f"{i}_x"] == (prompt_len - 1, 1) for i in (1, 2, 3))
    copies = [c for out in model.steps for c in out.blocks_to_copy]
    # The block holding the last prompt token is copied, unless that token starts a block.
    assert len(copies) == (3 if (prompt_len - 1) % BS else 0)
    assert sched.kv_cache_manager.num_free_blocks == 64


def test_samples_hold_about_one_prompt_of_blocks():
    sched = make_scheduler(num_blocks=64, block_size=BS, max_model_len=64)
    for r in _family(41, 8, max_tokens=3):
        sched.add_request(r)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    peak = 0
    while sched.has_unfinished_requests():
        step(sched, model, result)
        peak = max(peak, sched.kv_cache_manager.block_pool.num_used_blocks)
    # 10 full prompt blocks shared + per sample: its copy of the 11th, and room for 3 outputs.
    assert peak <= 11 + 8 * 2 < 8 * 11


def test_a_sample_waits_for_its_parent_and_starts_alone_if_the_parent_is_gone():
    sched = make_scheduler(block_size=BS, max_num_batched_tokens=8)
    leader, child = _family(20, 2, max_tokens=1)
    sched.add_request(leader)
    sched.add_request(child)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    out = step(sched, model, result)
    assert [s.request_id for s in out.scheduled] == ["0_x"]  # chunk 1 of the prompt; child waits
    while "1_x" not in {s.request_id for s in out.scheduled}:
        out = step(sched, model, result)
    # The parent finished after one token before the child could fork: the child runs alone.
    sched2 = make_scheduler(block_size=BS)
    leader, child = _family(20, 2, max_tokens=1)
    sched2.add_request(leader)
    sched2.add_request(child)
    sched2.finish_requests(["0_x"], RequestStatus.FINISHED_ABORTED)
    out = step(sched2, FakeModel(BS), RunResult({}, {}, {}, 0))
    assert [(s.request_id, s.num_computed_tokens) for s in out.scheduled] == [("1_x", 0)]


# ---- beams: pause, fork_request, parking ---------------------------------------------------
def _beam(rid: str, tokens: list[int]) -> Request:
    r = make_request(rid, prompt=tokens[:6], max_tokens=None)
    r.append_output_token_ids(tokens[6:])
    r.pause_after_sample, r.family_id = True, "beam"
    return r


def test_beams_pause_after_each_token_and_forks_share_then_copy_on_write():
    sched = make_scheduler(block_size=BS)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    root = _beam("b0", list(range(3, 9)))
    sched.add_request(root)
    step(sched, model, result)
    assert root.paused and root.num_tokens == 7 and root.num_computed_tokens == 6
    out = sched.schedule()
    assert out.is_empty  # paused: nothing to run until its beam search acts
    sched.update_from_output(out, model.execute(out))
    tokens = root.all_token_ids[:-1]
    kids = [_beam(f"b{i}", tokens + [40 + i]) for i in (1, 2, 3)]
    sched.fork_request("b0", kids)
    kv = sched.kv_cache_manager
    tables = [list(kv.get_block_ids(k.request_id)) for k in kids]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 2
    out = step(sched, model, result)
    assert "b0" in out.finished_req_ids
    # Position 6 lies in the shared 2nd block: the first two children copy it, the last one
    # holds it alone by then and writes in place.
    assert len(out.blocks_to_copy) == 2
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(6, 1)] * 3
    assert all(k.paused for k in kids)
    sched.fork_request("b1", [])  # a beam that is not continued just ends
    sched.finish_requests(["b2", "b3"], RequestStatus.FINISHED_ABORTED)
    sched.schedule()
    assert kv.num_free_blocks == 64 and not sched.has_unfinished_requests()


def test_fork_request_checks_its_arguments():
    sched = make_scheduler(block_size=BS)
    root = _beam("b0", list(range(3, 9)))
    sched.add_request(root)
    with pytest.raises(ValueError, match="not a paused"):
        sched.fork_request("b0", [])
    step(sched, FakeModel(BS), RunResult({}, {}, {}, 0))
    with pytest.raises(ValueError, match="not a fork"):
        sched.fork_request("b0", [_beam("c", list(range(10, 17)))])
    with pytest.raises(ValueError, match="in use"):
        sched.fork_request("b0", [_beam("b0", root.all_token_ids)])
    assert root.paused and sched.get_request("b0") is root


def test_a_preempted_paused_beam_is_parked_and_its_children_start_fresh():
    sched = make_scheduler(num_blocks=4, block_size=BS, max_model_len=16)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    beam = _beam("b0", list(range(3, 11)))  # 8 tokens: 2 full blocks
    sched.add_request(beam)
    step(sched, model, result)
    big = make_request("big", 8, max_tokens=8)
    sched.add_request(big)
    while beam.status == RequestStatus.RUNNING:
        step(sched, model, result)
    assert sched.parked == {"b0": beam} and beam.num_computed_tokens == 0
    assert sched.kv_cache_manager.get_block_ids("b0") == []
    kid = _beam("b1", beam.all_token_ids[:-1] + [50])
    sched.fork_request("b0", [kid])
    assert kid.status == RequestStatus.WAITING and sched.parked == {}
    result = run_to_completion_until(sched, model, "b1")
    assert kid.num_computed_tokens == kid.num_tokens - 1


def run_to_completion_until(sched, model, rid, max_steps=200):
    result = RunResult({}, {}, {}, 0)
    request = sched.get_request(rid)
    while not request.paused:
        assert result.num_steps < max_steps
        step(sched, model, result)
    return result


def test_forked_children_without_a_seat_wait_as_new_requests():
    sched = make_scheduler(block_size=BS, max_num_seqs=2)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    sched.add_request(_beam("b0", list(range(3, 9))))
    step(sched, model, result)
    tokens = sched.get_request("b0").all_token_ids[:-1]
    kids = [_beam(f"b{i}", tokens + [40 + i]) for i in (1, 2, 3)]
    sched.fork_request("b0", kids)
    assert [r.request_id for r in sched.running] == ["b1", "b2"]
    assert [r.request_id for r in sched.waiting] == ["b3"]
    run_to_completion_until(sched, model, "b1")
    for k in kids:
        sched.finish_requests([k.request_id], RequestStatus.FINISHED_ABORTED)
    sched.schedule()
    assert sched.kv_cache_manager.num_free_blocks == 64
