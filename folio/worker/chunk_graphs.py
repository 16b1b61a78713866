"""Which steps replay a chunk graph: one request's prompt chunk alone, padded up to a captured
token count, instead of launching the forward kernel by kernel.

A prompt step runs eagerly: ~250 Python kernel launches for the 0.6B, ~15 ms of host time where
a 1,024-token prompt's GPU work is ~3 ms (session 23, H100: time to first token 18.4-19.3 ms).
Small steps already replay the decode graphs as per-token sequences (per_token_steps.py), but
only up to the largest decode graph's tokens and while the per-token reads stay cheap, which a
chunk on a long cached prefix (the next turn of a chat) never is. A chunk graph is captured for
one sequence of `size` new tokens (StepInputBuilder.chunk_capture_inputs): every kernel's grid
then depends only on `size` (the attention's q blocks past the chunk's end exit), so the graph
replays any one-request chunk of at most `size` tokens on any context.

Sizes: 16, 32, ..., 256, then every 256 tokens up to a cap, and the cap itself. Padding costs
GPU work, launches saved cost host time, so the cap is where the GPU work of the padded chunk
would stop hiding behind the host: an eager layer launches in ~HOST_SECONDS_PER_LAYER, and the
linear layers of a token take 2 x (their weights per rank) FLOPs at ~ASSUMED_FLOPS; rounded down
to the grid, and never past the longest chunk the engine can schedule (max_num_batched_tokens,
max_model_len). The 0.6B gets chunk graphs up to MAX_TOKENS (4,096), the 8B up to 1,024;
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


def _cap_from_env() -> int | None:
    raw = os.environ.get("FOLIO_CHUNK_GRAPH_TOKENS")
    if raw is None:
        return None
    if not raw.isdigit():
        raise ValueError(f"FOLIO_CHUNK_GRAPH_TOKENS={raw!r}: expected a token count (0: no chunk graphs).")
    return int(raw)


def linear_params_per_token(model: ModelConfig, tp_size: int = 1) -> int:
    """Weights of the decoder layers' linear layers on one rank (what a token multiplies through):
    q/k/v, o, and a gated MLP. The LM head runs once a step, outside the graph."""
    cfg = model.hf_config
    hidden = model.hidden_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
    inter = int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden)
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    return model.num_layers * per_layer // max(tp_size, 1)


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


def takes_chunk_graph(scheduler_output: SchedulerOutput) -> bool:
    """A step of one request's prompt chunk (more than one new token, no drafts). Host ints only."""
    so = scheduler_output
    if len(so.scheduled) != 1:
        return False
    only = so.scheduled[0]
    return only.num_new_tokens > 1 and not only.spec_token_ids
