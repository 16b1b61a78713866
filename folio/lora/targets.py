"""LoRATarget: where a PEFT module name (`model.layers.3.self_attn.q_proj`) lands in folio's model.

folio merges q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj` (models/weight_utils.py
names the merges); an adapter still trains q, k, v, gate and up separately, so each PEFT module
maps to one shard of a folio linear layer: (layer name, shard index, input size, shard size).
Torch-free: sizes come from the layers' `input_size` / `output_sizes` attributes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The projections folio applies adapters to, by the name PEFT uses for them.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# folio's merged layer name -> the PEFT module name of each of its shards, in shard order.
MERGED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True)
class LoRATarget:
    layer_name: str  # folio module name, e.g. "model.layers.3.self_attn.qkv_proj"
    shard: int  # index among the layer's output shards (0 for an unmerged layer)
    input_size: int
    output_size: int  # this shard's output features


def adaptable_shards(layer_name: str, layer: Any) -> tuple[str, ...] | None:
    """The PEFT module name of each output shard of a linear layer, or None when folio does
    not adapt it (by its last name component: qkv_proj, gate_up_proj, o_proj, down_proj...)."""
    leaf = layer_name.rpartition(".")[2]
    names = MERGED_SHARDS.get(leaf, (leaf,) if leaf in SUPPORTED_MODULES else None)
    sizes = getattr(layer, "output_sizes", None)
    if names is None or sizes is None or len(sizes) != len(names):
        return None  # not a linear layer, or not shaped like the merge its name promises
    return names


def lora_targets(named_layers: Iterable[tuple[str, Any]]) -> dict[str, LoRATarget]:
    """PEFT module name -> LoRATarget for every adaptable linear layer among (name, module);
    sizes are the whole (checkpoint) sizes, before any tensor-parallel split."""
    targets: dict[str, LoRATarget] = {}
    for name, layer in named_layers:
        shard_names = adaptable_shards(name, layer)
        if shard_names is None:
            continue
        prefix = name.rpartition(".")[0]
        for shard, (shard_name, size) in enumerate(zip(shard_names, layer.output_sizes)):
            hf_name = f"{prefix}.{shard_name}" if prefix else shard_name
            targets[hf_name] = LoRATarget(name, shard, int(layer.input_size), int(size))
    return targets
