"""Which steps replay a chunk graph: one request's prompt chunk, alone or beside decodes, padded
up to a captured shape, instead of launching the forward kernel by kernel.

A prompt step runs eagerly: ~250 Python kernel launches for the 0.6B, ~15 ms of host time where
a 1,024-token prompt's GPU work is ~3 ms (session 23, H100: time to first token 18.4-19.3 ms).
Small steps already replay the decode graphs as per-token sequences (per_token_steps.py), but
only up to the largest decode graph's tokens and while the per-token reads stay cheap, which a
chunk on a long cached prefix (the next turn of a chat) never is. A chunk graph is captured for
one sequence of `size` new tokens (StepInputBuilder.chunk_capture_inputs): every kernel's grid
then depends only on `size` (the attention's q blocks past the chunk's end exit), so the graph
replays any one-request chunk of at most `size` tokens on any context.

A graph's key is (chunk tokens, decode slots). A chunk alone replays (size, 0), for sizes 16, 32,
..., 256, then every 256 tokens up to a cap, and the cap itself. A chunk beside d decodes (a new
request joining a running batch: the steps that otherwise stall every decode for a whole eager
forward) replays (t, slots) with t from MIXED_TOKENS (coarser, up to the cap) and slots from
DECODE_SLOTS: the decodes are sequences of one token, padded with empty sequences.
FOLIO_CHUNK_GRAPH_DECODES=0 keeps those steps eager (the A/B switch; H100, the 0.6B served at 20
requests a second: mean time to first token 32-41 -> 10-11 ms against all chunk graphs off, session
24; 57 -> 13 ms against chunk-alone graphs only, session 25; p99 inter-token latency ~20-38 -> ~4 ms).

The cap: padding costs GPU work, launches saved cost host time, so the cap is where the GPU work
of the padded chunk would stop hiding behind the host: an eager layer launches in
~HOST_SECONDS_PER_LAYER, and the linear layers of a token take 2 x (their weights per rank) FLOPs
at ~ASSUMED_FLOPS; rounded down to the grid, and never past the longest chunk the engine can
schedule (max_num_batched_tokens, max_model_len). The 0.6B gets chunk graphs up to MAX_TOKENS (4,096), the 8B up to 1,024;
FOLIO_CHUNK_GRAPH_TOKENS sets the cap (0: none).
"""

from __future__ import annotations

import os

from folio.config.model import ModelConfig
from folio.core.scheduler_output import SchedulerOutput

MAX_TOKENS = 4096  # the 0.6B's 4k prompt is ~10 ms of GPU work, near its ~15 ms of launches
# Eager launches of one decoder layer: ~0.54 ms on one H100 host, ~1.2 ms on another (session 24:
# the 0.6B's eager 2k-token prompt 18.8 vs 33.9 ms to first token); between the two.
HOST_SECONDS_PER_LAYER = 0.75e-3
ASSUMED_FLOPS = 600e12  # bf16 GEMMs of 512-8k rows on an H100 (the 8B's 8k prefill: ~745 TFLOP/s)
SMALL_SIZES = (16, 32, 64, 128, 256)
STEP = 256
MIXED_TOKENS = (64, 256, 512, 1024, 2048, 4096)  # chunk buckets of the graphs with decodes
# Decodes those graphs hold (at most max_num_seqs - 1). 7: a chunk beside 1-7 decodes is at most 8
# sequences (triton_backend.PREFILL_MAX_SEQS), so a graph of >= 256 chunk tokens was captured with
# the long-chunk attention kernels, as an eager step of a long chunk would take; the larger slot
# counts freeze the mixed-batch kernel. (Padding can move a shorter chunk to another kernel than
# its eager step's: the same attention, other tiles.)
DECODE_SLOTS = (7, 16, 64, 256)
ChunkKey = tuple[int, int]  # (chunk tokens, decode slots) of a chunk graph


def _cap_from_env() -> int | None:
    raw = os.environ.get("FOLIO_CHUNK_GRAPH_TOKENS")
    if raw is None:
        return None
    if not raw.isdigit():
        raise ValueError(f"FOLIO_CHUNK_GRAPH_TOKENS={raw!r}: expected a token count (0: no chunk graphs).")
    return int(raw)


def _widths(model: ModelConfig) -> tuple[int, int, int, int]:
    """(hidden, q, k or v, MLP intermediate) widths of a decoder layer."""
    hidden, cfg = model.hidden_size, model.hf_config
    inter = int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden)
    return hidden, model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim, inter


def linear_params_per_token(model: ModelConfig, tp_size: int = 1) -> int:
    """Weights of the decoder layers' linear layers on one rank (what a token multiplies through):
    q/k/v, o, and a gated MLP. The LM head runs once a step, outside the graph."""
    hidden, q, kv, inter = _widths(model)
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    return model.num_layers * per_layer // max(tp_size, 1)


def chunk_graph_bytes(model: ModelConfig, keys: list[ChunkKey], itemsize: int, tp_size: int = 1) -> int:
    """What the chunk graphs add to the graphs' memory pool: the live activations of one decoder
    layer at the largest key's tokens (q, k, v, the attention's output, gate/up, SiLU's output,
    three hidden-sized tensors a token) and every graph's output [tokens, hidden]. The 0.6B's 44
    graphs: ~0.3 GB; its pool grew 0.16 GiB for its first 20 (session 24)."""
    if not keys:
        return 0
    hidden, q, kv, inter = _widths(model)
    per_token = (2 * q + 2 * kv + 3 * inter) // max(tp_size, 1) + 3 * hidden
    return itemsize * (max(t + d for t, d in keys) * per_token + sum(t + d for t, d in keys) * hidden)


def chunk_graph_cap(model: ModelConfig, max_chunk: int, tp_size: int = 1) -> int:
    """The largest chunk that gets a graph: where the padded chunk's GPU work still hides behind
    the launches it saves (module docstring), at most MAX_TOKENS and max_chunk (the step's token
    budget and max_model_len: a capture's one sequence must fit the block table)."""
    env = _cap_from_env()
    if env is not None:
        return min(env, max_chunk)
    host = HOST_SECONDS_PER_LAYER * model.num_layers
    flops_per_token = 2 * linear_params_per_token(model, tp_size)
    hidden = min(MAX_TOKENS, int(host * ASSUMED_FLOPS / max(flops_per_token, 1)))
    on_grid = max([s for s in (*SMALL_SIZES, *range(2 * STEP, hidden + 1, STEP)) if s <= hidden], default=0)
    return min(on_grid, max_chunk)


def chunk_graph_sizes(cap: int) -> list[int]:
    """[16, 32, 64, 128, 256, 512, 768, ...] below cap, then cap (every chunk up to it has one)."""
    if cap < 2:
        return []
    sizes = [s for s in SMALL_SIZES if s < cap]
    sizes.extend(range(2 * STEP, cap, STEP))
    return sizes + [cap]


def _decodes_from_env() -> bool:
    raw = os.environ.get("FOLIO_CHUNK_GRAPH_DECODES", "1")
    if raw not in ("0", "1"):
        raise ValueError(f"FOLIO_CHUNK_GRAPH_DECODES={raw!r}: expected 1 (the default) or 0 "
                         "(no graphs beside decodes).")
    return raw == "1"


def chunk_graph_keys(cap: int, max_num_seqs: int, max_num_tokens: int,
                     with_decodes: bool | None = None) -> list[ChunkKey]:
    """Every chunk graph's key: the chunk alone at each size up to cap, and (with_decodes; None:
    FOLIO_CHUNK_GRAPH_DECODES) beside decodes at MIXED_TOKENS (below cap, and cap) x DECODE_SLOTS,
    a chunk cut to what the step's token budget leaves beside its decodes."""
    keys = {(size, 0) for size in chunk_graph_sizes(min(cap, max_num_tokens))}
    if keys and (_decodes_from_env() if with_decodes is None else with_decodes):
        slots = {min(d, max_num_seqs - 1) for d in DECODE_SLOTS} - {0}
        tokens = {t for t in MIXED_TOKENS if t < cap} | {cap}
        keys |= {(min(t, max_num_tokens - d), d) for t in tokens for d in slots if max_num_tokens - d >= 2}
    return sorted(keys)


def chunk_step_shape(scheduler_output: SchedulerOutput) -> tuple[int, int] | None:
    """(chunk tokens, decodes) of a step with one request's prompt chunk (more than one new token)
    and otherwise decodes (one new token each), none with drafts; else None. Host ints only."""
    chunk, decodes = None, 0
    for sched in scheduler_output.scheduled:
        if sched.spec_token_ids:
            return None
        if sched.num_new_tokens == 1:
            decodes += 1
        elif chunk is not None:
            return None  # two chunks
        else:
            chunk = sched.num_new_tokens
    return None if chunk is None else (chunk, decodes)
