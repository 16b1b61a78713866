"""Linear layers: a shape role (how the weight splits over ranks) plus a method (its storage).

The seam shared by quantization, tensor parallelism and LoRA (docs/linear-layers.md):
- the role decides this rank's input_size_per_partition and output_partition_sizes
  ("replicated": everything; "column": output features split; "row": input features split,
  output all-reduced, bias added once after the reduce);
- the method (picked by the model's QuantizationConfig, unquantized when there is none)
  registers the parameters, finishes them after loading and applies the matmul;
- weight_loader(param, loaded, shard_id) narrows a checkpoint tensor to this rank's slice along
  the parameter's output_dim / input_dim (respecting packing) and copies it at the merged
  shard's offset. A merged layer (QKV, gate/up) stacks several checkpoint matrices along the
  output dimension; `shard_ids` lists every shard that must arrive before a parameter counts
  as loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from folio.layers.checkpoint_slice import as_tensor
from folio.layers.quantization.base import LinearMethod, UnquantizedLinearMethod, set_weight_attrs
from folio.parallel import all_reduce, get_tp_rank, get_tp_size

if TYPE_CHECKING:
    from folio.layers.quantization.base import QuantizationConfig

Role = Literal["replicated", "column", "row"]


def check_shape(name: str, expected: torch.Size, loaded: torch.Tensor) -> None:
    if tuple(expected) != tuple(loaded.shape):
        raise ValueError(
            f"Checkpoint tensor for {name} has shape {tuple(loaded.shape)}, "
            f"the model expects {tuple(expected)}."
        )


def check_fp8_codes(name: str, expected: torch.dtype, loaded: torch.dtype) -> None:
    """FP8 weights must arrive as FP8 codes: a float weight cast to e4m3 and then multiplied by
    its scale would be silently wrong (e.g. a compressed-tensors checkpoint saved 'dense')."""
    if expected == torch.float8_e4m3fn and loaded != expected:
        raise ValueError(
            f"Checkpoint tensor for {name} is {loaded}, but its quantization_config says FP8 "
            "(float8_e4m3fn codes with scales); save the checkpoint compressed."
        )


def _split(size: int, parts: int, what: str) -> int:
    if size % parts:
        raise ValueError(f"{what} ({size}) does not divide over {parts} tensor-parallel ranks.")
    return size // parts


class LinearBase(nn.Module):
    """y = x W^T + b for one shape role, with the weight stored the way `method` wants."""

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        bias: bool,
        role: Role,
        quant_config: QuantizationConfig | None,
        prefix: str,
        shard_ids: Sequence[str | int] | None = None,
    ) -> None:
        super().__init__()
        if shard_ids is not None and len(shard_ids) != len(output_sizes):
            raise ValueError("A merged linear layer needs one shard id per output size.")
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(self.output_sizes)
        self.role: Role = role
        self.prefix = prefix
        self.shard_ids = tuple(shard_ids) if shard_ids is not None else None
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size_per_partition, self.output_partition_sizes = self.partition()
        self.offsets = [
            sum(self.output_partition_sizes[:i]) for i in range(len(self.output_partition_sizes))
        ]
        self.quant_method: LinearMethod = (
            quant_config.get_linear_method(prefix) if quant_config else UnquantizedLinearMethod()
        )
        self.quant_method.create_weights(
            self,
            self.input_size_per_partition,
            self.output_partition_sizes,
            self.input_size,
            self.output_size,
            torch.get_default_dtype(),
        )
        if bias:
            out = sum(self.output_partition_sizes)
            self.bias = nn.Parameter(torch.empty(out), requires_grad=False)
            set_weight_attrs(self.bias, output_dim=0, input_dim=None)
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            set_weight_attrs(param, weight_loader=self.weight_loader)
            if self.shard_ids is not None:
                set_weight_attrs(param, shard_ids=self.shard_ids)

    # ---- shape role -----------------------------------------------------------------------
    def partition(self) -> tuple[int, list[int]]:
        """(input_size_per_partition, output_partition_sizes) of this rank."""
        if self.role == "column":
            what = f"{self.prefix or 'a column-parallel layer'} output"
            return self.input_size, [_split(s, self.tp_size, what) for s in self.output_sizes]
        if self.role == "row":
            what = f"{self.prefix or 'a row-parallel layer'} input"
            return _split(self.input_size, self.tp_size, what), list(self.output_sizes)
        return self.input_size, list(self.output_sizes)

    def shard_slice(self, index: int) -> tuple[int, int]:
        """(start, size) along output features of this rank's part of checkpoint shard `index`."""
        size = self.output_partition_sizes[index]
        return (self.tp_rank * size, size) if self.role == "column" else (0, size)

    def input_slice(self) -> tuple[int, int]:
        """(start, size) along input features of this rank's part of the checkpoint tensor."""
        size = self.input_size_per_partition
        return (self.tp_rank * size, size) if self.role == "row" else (0, size)

    # ---- loading --------------------------------------------------------------------------
    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy this rank's slice of one checkpoint tensor into `param` (dtype converted)."""
        where = self._param_name(param)
        if shard_id is not None:
            where = f"shard {shard_id!r} of {where}"
        index = self._shard_index(shard_id, where)
        if getattr(param, "shard_scale", False):
            # Dim 0 indexes merged shards: [num_shards] scales or [num_shards, ...] rows.
            self._load_shard_entry(param, loaded, index, where)
            return
        target = param.data
        output_dim, input_dim = param.output_dim, param.input_dim  # type: ignore[attr-defined]
        if output_dim is not None:
            shard = 0 if index is None else index
            start, size = self.shard_slice(shard) if index is not None else self._whole_output()
            offset = self.offsets[shard] if index is not None else 0
            offset, start, size = self._packed(param, output_dim, offset, start, size)
            target = target.narrow(output_dim, offset, size)
            loaded = self._narrow_checked(loaded, output_dim, start, size, where)
        if input_dim is not None:
            start, size = self.input_slice()
            _, start, size = self._packed(param, input_dim, 0, start, size)
            group = getattr(param, "group_size", None)  # per-group scales: one row per group
            if group:
                start, size = start // group, size // group
            loaded = self._narrow_checked(loaded, input_dim, start, size, where)
        check_shape(where, target.shape, loaded)
        tensor = as_tensor(loaded)  # reads only this rank's slice of a checkpoint file
        check_fp8_codes(where, target.dtype, tensor.dtype)
        target.copy_(tensor)

    def _load_shard_entry(
        self, param: nn.Parameter, loaded: torch.Tensor, index: int | None, where: str
    ) -> None:
        target = param.data[0 if index is None else index]
        loaded = as_tensor(loaded)  # a lazily sliced checkpoint tensor, read now
        if target.dim() == 0:
            if loaded.numel() != 1:
                raise ValueError(f"{where}: expected a per-tensor scale, got {tuple(loaded.shape)}.")
            loaded = loaded.reshape(())
        elif param.input_dim is not None:  # type: ignore[attr-defined]
            start, size = self.input_slice()
            loaded = self._narrow_checked(loaded, param.input_dim - 1, start, size, where)  # type: ignore[attr-defined]
        check_shape(where, target.shape, loaded)
        target.copy_(loaded)

    def _param_name(self, param: nn.Parameter) -> str:
        name = next((n for n, p in self.named_parameters(recurse=False) if p is param), "?")
        return f"{self.prefix}.{name}" if self.prefix else name

    def _shard_index(self, shard_id: str | int | None, where: str) -> int | None:
        if shard_id is None:
            return None
        if self.shard_ids is None or shard_id not in self.shard_ids:
            raise ValueError(f"{where}: this layer has no shard {shard_id!r}.")
        return self.shard_ids.index(shard_id)

    def _whole_output(self) -> tuple[int, int]:
        size = sum(self.output_partition_sizes)
        return (self.tp_rank * size, size) if self.role == "column" else (0, size)

    @staticmethod
    def _packed(
        param: nn.Parameter, dim: int, offset: int, start: int, size: int
    ) -> tuple[int, int, int]:
        """Offsets along a packed axis count packed elements (pack_factor values each)."""
        if getattr(param, "packed_dim", None) != dim:
            return offset, start, size
        factor = param.pack_factor  # type: ignore[attr-defined]
        return offset // factor, start // factor, size // factor

    def _narrow_checked(
        self, loaded: torch.Tensor, dim: int, start: int, size: int, where: str
    ) -> torch.Tensor:
        if self.tp_size == 1:
            return loaded  # the whole tensor is this rank's; check_shape reports a mismatch
        if loaded.dim() <= dim or loaded.shape[dim] < start + size:
            raise ValueError(f"{where}: checkpoint tensor {tuple(loaded.shape)} is too small.")
        return loaded.narrow(dim, start, size)

    # ---- forward --------------------------------------------------------------------------
    @property
    def takes_fp8_activation(self) -> bool:
        """Whether forward takes fp8_gemm.Fp8Activation input (an FP8 method with per-token
        activation scales): the RMSNorm before it may then quantize in its own kernel."""
        return self.quant_method.takes_fp8_activation(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.role != "row" or self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)  # [tokens, out_per_partition]
        out = all_reduce(self.quant_method.apply(self, x, None))  # [tokens, out]
        return out if self.bias is None else out + self.bias

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[tokens, sum(output_partition_sizes)] -> one view per merged shard."""
        return tuple(out.split(self.output_partition_sizes, dim=-1))

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
            f"role={self.role}, method={self.quant_method.name}"
        )


class Linear(LinearBase):
    """A single projection; the whole weight on every rank unless `role` says otherwise."""

    default_role: Role = "replicated"

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        role: Role | None = None,
    ) -> None:
        role = role or self.default_role
        super().__init__(input_size, [output_size], bias, role, quant_config, prefix)


class ColumnParallelLinear(Linear):
    """Output features split over ranks; each rank's output is its slice (no gather)."""

    default_role: Role = "column"


class RowParallelLinear(Linear):
    """Input features split over ranks; partial outputs are all-reduced, then the bias added."""

    default_role: Role = "row"


class MergedColumnLinear(LinearBase):
    """Several projections of the same input stacked along the output dimension.

    Shard i occupies output rows [offsets[i], offsets[i] + output_partition_sizes[i]); the
    checkpoint stores each shard as its own matrix, loaded by shard id.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        shard_ids: Sequence[str | int],
        bias: bool = False,
        *,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        if len(output_sizes) != len(shard_ids):
            raise ValueError("MergedColumnLinear needs one shard id per output size.")
        super().__init__(input_size, output_sizes, bias, "column", quant_config, prefix, shard_ids)

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int) -> None:
        self.weight_loader(param, loaded, shard_id)


class QKVLinear(MergedColumnLinear):
    """Q, K and V projections in one matmul: [tokens, hidden] -> [tokens, (H + 2 * Hkv) * D]
    per rank, with H and Hkv this rank's heads.

    Query heads split evenly over the ranks. KV heads split too while there are at least as
    many as ranks; with fewer, each is replicated on tp / Hkv consecutive ranks, so every rank
    holds exactly the KV head its query heads read (rank r: head r // (tp / Hkv)).
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        *,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(
            hidden_size,
            [q_size, kv_size, kv_size],
            ("q", "k", "v"),
            bias,
            quant_config=quant_config,
            prefix=prefix,
        )

    @property
    def num_heads_per_rank(self) -> int:
        return self.output_partition_sizes[0] // self.head_dim

    @property
    def num_kv_heads_per_rank(self) -> int:
        return self.output_partition_sizes[1] // self.head_dim

    def partition(self) -> tuple[int, list[int]]:
        tp, heads, kv_heads = self.tp_size, self.num_heads, self.num_kv_heads
        if heads % tp:
            raise ValueError(f"{heads} attention heads do not divide over {tp} tensor-parallel ranks.")
        if (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
            raise ValueError(
                f"{kv_heads} KV heads cannot be split or replicated evenly over {tp} tensor-parallel ranks."
            )
        q_size = heads // tp * self.head_dim
        kv_size = max(kv_heads // tp, 1) * self.head_dim
        return self.input_size, [q_size, kv_size, kv_size]

    def shard_slice(self, index: int) -> tuple[int, int]:
        size = self.output_partition_sizes[index]
        if index == 0:
            return self.tp_rank * size, size
        replicas = max(self.tp_size // self.num_kv_heads, 1)  # ranks sharing one KV head
        return self.tp_rank // replicas * size, size
