"""Startup bounds on the flags that size host buffers: a value whose buffers cannot fit in this
machine's memory is a ValueError naming the flag and what it would need.

Why up front: the worker allocates these buffers with torch.zeros / np.zeros on the host, and
Linux overcommits, so a huge --max-num-batched-tokens did not fail its allocation: the process
was OOM-killed while zero-filling (exit 137, no message). The estimates are lower bounds of
what the worker allocates (worker/step_inputs.py, worker/block_table.py, lora/mapping.py,
lora/layers.py, core/block_pool.py), so a value that passes is never refused wrongly; device
memory is not checked here (a CUDA allocation fails cleanly, and the worker names the flag).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from folio.config.engine import EngineConfig

_GIB = 1 << 30
# One BlockPool entry: a list slot plus an OrderedDict node (Python objects, at least this much).
_BOOKKEEPING_PER_BLOCK = 64
_INT64, _INT32 = 8, 4


@dataclass(frozen=True)
class Need:
    name: str  # the argument (its flag is --name with dashes)
    value: object
    bytes: int  # at least this much host memory
    what: str
    # Committed page by page as it is used (the CPU KV cache, the swap pool): bounded by the
    # machine's total memory, not by what is free now.
    lazy: bool = False


def check_host_memory(config: EngineConfig) -> None:
    """ValueError for the first flag whose buffers exceed the host's memory."""
    available, total = host_memory_bytes()
    for need in host_needs(config):
        limit, kind = (total, "in total") if need.lazy else (available, "available")
        if need.bytes > limit:
            flag = "--" + need.name.replace("_", "-")
            raise ValueError(
                f"{need.name} ({flag}) = {need.value} would need at least {_gib(need.bytes)} of host memory "
                f"for {need.what}; this machine has {_gib(limit)} {kind}. Lower {flag}."
            )


def host_needs(config: EngineConfig) -> list[Need]:
    """What each buffer-sizing flag costs in host memory, at least (on the CPU the device
    copies are host memory too)."""
    copies = 2 if config.device.device == "cpu" else 1  # host buffer, plus its device twin on the CPU
    sched = config.scheduler
    blocks_per_seq = math.ceil(sched.max_model_len / config.cache.block_size)
    per_token = 3 * _INT64 + (2 * _INT32 if config.lora is not None else 0)  # ids, positions, slots
    # BlockTable (2 rows a sequence) + the step's flat table, and four per-row Python lists
    per_seq = 3 * blocks_per_seq * _INT32 + (copies - 1) * blocks_per_seq * _INT32 + 8 * _INT64
    # max_num_seqs first: an unset max_num_batched_tokens follows it (arg_utils), and the error
    # should name the flag the user gave.
    needs = [
        Need("max_num_seqs", sched.max_num_seqs, per_seq * sched.max_num_seqs,
             f"its per-sequence block tables ({per_seq} bytes a sequence at max_model_len {sched.max_model_len})"),
        Need("max_num_batched_tokens", sched.max_num_batched_tokens, copies * per_token * sched.max_num_batched_tokens,
             f"its per-token step buffers ({copies * per_token} bytes a token)"),
    ]
    needs += _lora_needs(config, copies) + _block_needs(config)
    return needs


def _lora_needs(config: EngineConfig, copies: int) -> list[Need]:
    if config.lora is None:
        return []
    per_slot = copies * 6 * _INT32  # lora/mapping.py: six int32 block arrays grow by one a slot
    if copies == 2:  # on the CPU the slots' A and B are host memory: >= rank x hidden each, a layer
        itemsize = 4 if config.model.dtype == "float32" else 2
        per_slot += 2 * config.model.num_layers * config.lora.max_lora_rank * config.model.hidden_size * itemsize
    return [Need("max_loras", config.lora.max_loras, per_slot * config.lora.max_loras,
                 f"its adapter slots ({per_slot} bytes a slot at max_lora_rank {config.lora.max_lora_rank})")]


def _block_needs(config: EngineConfig) -> list[Need]:
    needs = []
    block_bytes = _kv_bytes_per_block(config)
    override = config.cache.num_gpu_blocks_override
    if override is not None:
        per_block = _BOOKKEEPING_PER_BLOCK + (block_bytes if config.device.device == "cpu" else 0)
        needs.append(Need("num_gpu_blocks_override", override, per_block * override,
                          f"the KV cache's blocks ({per_block} bytes a block)", lazy=True))
    swap = config.cache.swap_space_gib
    if config.scheduler.preemption_mode != "recompute" and swap > 0:
        ranks = config.parallel.ranks_per_node  # each rank of this node pins a pool of its own
        blocks = int(swap * _GIB) // max(block_bytes, 1)
        needs.append(Need("swap_space", swap, int(swap * _GIB) * ranks + blocks * _BOOKKEEPING_PER_BLOCK,
                          f"the swap pool ({swap:g} GiB on each of this node's {ranks} rank(s))", lazy=True))
    return needs


def _kv_bytes_per_block(config: EngineConfig) -> int:
    per_token = config.model.kv_bytes_per_token()
    if config.cache.fp8:  # one byte an element instead of the model dtype's
        per_token //= 4 if config.model.dtype == "float32" else 2
    return per_token * config.cache.block_size // config.parallel.tensor_parallel_size


def _gib(num_bytes: int) -> str:
    gib = num_bytes / _GIB
    return f"{gib:.1f} GiB" if gib < 1e6 else f"{gib:.2e} GiB"


def host_memory_bytes() -> tuple[int, int]:
    """(available now, total) host memory in bytes: /proc/meminfo's MemAvailable where there is
    one (what can be allocated without swapping or the OOM killer), else the total."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total
    except (OSError, ValueError, IndexError):
        pass
    return total, total
