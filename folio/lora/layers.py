"""LoRALinear: a finished linear layer plus the batched adapter delta of each token's slot.

The wrapper owns the stacked slot tensors of its layer, zero-padded so their shapes never change
(CUDA graphs keep working whatever adapters are loaded):
  lora_a [max_loras, shards * max_lora_rank, in_per_partition]: shard j's A in rows j*r_max...;
  lora_b [max_loras, out_per_partition, max_lora_rank]: shard j's B (scaling folded in) in
  its output rows, so it only ever meets its own A's result.
Tensor parallelism follows the base layer's role (docs/linear-layers.md): a column-parallel
layer keeps this rank's output rows of B, a row-parallel one this rank's input columns of A,
and its delta is added before the all-reduce (the bias after it, once).

Stacked A (an unquantized base, docs/lora.md): lora_a is a view of extra output rows under the
base weight, `stacked_weight = [W; A_slot0; ...]`, and base.weight a view of its first rows. A
step with adapters runs one GEMM for the base output and every token's shrink under every slot,
and the expand reads each token's own slot's columns: no shrink kernel (6.8 us per launch on
the H100, four per layer, while the extra rows cost ~2% more weight reads at 8 slots of rank
16). A step without adapters multiplies by the base rows alone. Used when the stacked rows are
at most 1/8 of the layer's; FOLIO_LORA_STACKED=1 / 0 forces it on / off (tests, A/B runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from folio.kernels.activation import silu_and_mul
from folio.kernels.lora_expand import ShrinkSource, lora_expand_stacked_reference, lora_expand_stacked_triton
from folio.kernels.lora_shrink import lora_shrink_triton
from folio.kernels.lora_silu_and_mul import lora_silu_and_mul_triton
from folio.kernels.triton_compat import use_triton_for
from folio.layers.linear import LinearBase
from folio.layers.quantization.base import UnquantizedLinearMethod
from folio.logger import init_logger
from folio.lora.adapter import LoRAAdapter
from folio.lora.delta import add_lora_delta
from folio.lora.mapping import LoRAMapping
from folio.parallel import all_reduce

logger = init_logger(__name__)
_WARNED: set[str] = set()  # quantization methods FOLIO_LORA_STACKED=1 could not stack (logged once each)


class LoRALinear(nn.Module):
    def __init__(
        self,
        base_layer: LinearBase,
        shard_names: tuple[str, ...],  # the PEFT module name of each output shard
        max_loras: int,
        max_lora_rank: int,
        current_mapping: Callable[[], LoRAMapping],
        dtype: torch.dtype,  # the model's activations' dtype (a quantized weight's is not)
    ) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.shard_names = shard_names
        self.max_lora_rank = max_lora_rank
        self.current_mapping = current_mapping  # the step's token -> slot mapping (one shared buffer)
        self.shard_sizes = list(base_layer.output_partition_sizes)
        device = next(base_layer.parameters()).device
        shards, out = len(self.shard_sizes), sum(self.shard_sizes)
        in_size = base_layer.input_size_per_partition
        rows = shards * max_lora_rank
        self.stacked_weight: torch.Tensor | None = None  # [out + max_loras * rows, in]
        self.stacked_bias: torch.Tensor | None = None
        if stack_lora_a(base_layer, max_loras * rows, dtype):
            self.stacked_weight = _stack_under(base_layer, max_loras * rows)
            self.lora_a = self.stacked_weight[out:].view(max_loras, rows, in_size)
            if base_layer.bias is not None:  # the same storage: a write to the bias reaches both paths
                self.stacked_bias = _stack_under(base_layer, max_loras * rows, "bias")
        else:
            self.lora_a = torch.zeros(max_loras, rows, in_size, dtype=dtype, device=device)
        self.lora_b = torch.zeros(max_loras, out, max_lora_rank, dtype=dtype, device=device)
        offsets = [0, *(sum(self.shard_sizes[: i + 1]) for i in range(shards))]
        self.shard_offsets = torch.tensor(offsets, dtype=torch.int32, device=device)

    # ---- slots ------------------------------------------------------------------------------
    def set_slot(self, slot: int, adapter: LoRAAdapter, module_prefix: str) -> None:
        """Copy the adapter's weights for this layer into `slot`; shards it does not adapt,
        and ranks past its own, stay zero (so they add nothing)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        base, r_max = self.base_layer, self.max_lora_rank
        in_start, in_size = base.input_slice()
        for j, shard_name in enumerate(self.shard_names):
            weights = adapter.modules.get(f"{module_prefix}.{shard_name}")
            if weights is None:
                continue
            rank = weights.lora_a.shape[0]
            out_start, out_size = base.shard_slice(j)
            a = weights.lora_a.narrow(1, in_start, in_size)  # [rank, in_per_partition]
            b = weights.lora_b.narrow(0, out_start, out_size)  # [out_per_partition, rank]
            self.lora_a[slot, j * r_max : j * r_max + rank].copy_(a)
            row = base.offsets[j]
            self.lora_b[slot, row : row + out_size, :rank].copy_(b)

    def clear_slot(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.base_layer
        mapping = self.current_mapping()
        if self.stacked_weight is not None and mapping.any_adapter:
            return self._stacked_forward(x, mapping)
        if base.role == "row" and base.tp_size > 1:
            y = base.quant_method.apply(base, x, None)  # [tokens, out] partial sums
            self._add_delta(y, x, mapping)
            y = all_reduce(y)
            return y if base.bias is None else y + base.bias
        y = base(x)  # [tokens, out_per_partition]
        return self._add_delta(y, x, mapping)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU-and-mul of this (merged gate/up) layer's output with the delta: on CUDA the delta
        is added inside the activation kernel (kernels/lora_silu_and_mul.py), sparing the
        expand's read and write of the whole [tokens, 2 * inter] output; elsewhere the
        unfused path. LlamaMLP calls it when its gate_up projection is a LoRALinear."""
        mapping = self.current_mapping()
        if self.stacked_weight is not None and mapping.any_adapter:
            y_ext = F.linear(x, self.stacked_weight, self.stacked_bias)  # [tokens, 2 * inter + slots * 2 * r]
            n = self.lora_b.shape[1]  # 2 * inter_per_partition: the base columns
            if use_triton_for(x) and len(self.shard_sizes) == 2:
                source = ShrinkSource.stacked(y_ext, n, self.lora_a.shape[1])
                return lora_silu_and_mul_triton(y_ext[:, :n], source, self.lora_b, mapping.sorted_tokens, mapping.act_blocks)
            return silu_and_mul(self._stacked_expand(y_ext, x, mapping))
        y = self.base_layer(x)  # [tokens, 2 * inter_per_partition] column-parallel: no reduce
        if mapping.any_adapter and use_triton_for(x) and len(self.shard_sizes) == 2:
            shrunk = lora_shrink_triton(x, self.lora_a, mapping.sorted_tokens, mapping.blocks, keep_splits=True)
            return lora_silu_and_mul_triton(y, shrunk, self.lora_b, mapping.sorted_tokens, mapping.act_blocks)
        return silu_and_mul(self._add_delta(y, x, mapping))

    def _stacked_forward(self, x: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        base = self.base_layer
        if base.role == "row" and base.tp_size > 1:  # partial sums: the delta too, then one reduce
            y = all_reduce(self._stacked_expand(F.linear(x, self.stacked_weight), x, mapping))
            return y if base.bias is None else y + base.bias
        return self._stacked_expand(F.linear(x, self.stacked_weight, self.stacked_bias), x, mapping)

    def _stacked_expand(self, y_ext: torch.Tensor, x: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        """[tokens, out] from the stacked GEMM's output: base columns plus each token's delta."""
        if use_triton_for(x):
            return lora_expand_stacked_triton(y_ext, self.lora_b, self.shard_offsets, mapping.sorted_tokens,
                                              mapping.act_blocks, self.shard_sizes)
        return lora_expand_stacked_reference(y_ext, self.lora_b, mapping.token_slots[: x.shape[0]], self.shard_sizes)

    def _add_delta(self, y: torch.Tensor, x: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        return add_lora_delta(y, x, self.lora_a, self.lora_b, mapping, self.shard_sizes, self.shard_offsets)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.base_layer.split(out)

    def extra_repr(self) -> str:
        stacked = ", A stacked under the base weight" if self.stacked_weight is not None else ""
        return f"shards={self.shard_names}, slots={self.lora_a.shape[0]}, r_max={self.max_lora_rank}{stacked}"


def stack_lora_a(base: LinearBase, rows: int, dtype: torch.dtype) -> bool:
    """Whether the slots' A rows go under this layer's weight (see the module docstring)."""
    setting = os.environ.get("FOLIO_LORA_STACKED", "auto")
    if setting not in ("auto", "0", "1"):
        raise ValueError(f"FOLIO_LORA_STACKED must be auto, 0 or 1, got {setting!r}.")
    weight = getattr(base, "weight", None)
    # exactly the unquantized method: the stacked path calls F.linear itself, as its apply does
    usable = (type(base.quant_method) is UnquantizedLinearMethod and isinstance(weight, torch.Tensor)
              and weight.dtype == dtype and weight.dim() == 2 and weight.is_contiguous())
    if setting == "1" and not usable and base.quant_method.name not in _WARNED:
        _WARNED.add(base.quant_method.name)
        logger.warning("FOLIO_LORA_STACKED=1: layers with a %s weight keep the shrink kernel "
                       "(stacking needs an unquantized weight in the model dtype).", base.quant_method.name)
    if setting != "auto":
        return usable and setting == "1"
    return usable and rows * 8 <= weight.shape[0]


def _stack_under(base: LinearBase, rows: int, name: str = "weight") -> torch.Tensor:
    """A tensor of the base's `name` parameter (weight [out, in] or bias [out]) with `rows` zero
    rows after it; the parameter now views its first rows (the old storage is freed)."""
    param = getattr(base, name)
    stacked = torch.zeros((param.shape[0] + rows, *param.shape[1:]), dtype=param.dtype, device=param.device)
    stacked[: param.shape[0]].copy_(param.data)
    param.data = stacked[: param.shape[0]]
    return stacked
