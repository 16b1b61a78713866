"""INT4 weight-only (W4A16) linear layers: GPTQ, AWQ and compressed-tensors pack-quantized
checkpoints, or round-to-nearest on load (`int4-rtn`), all repacked into the one layout of
folio/kernels/w4a16_gemm.py.

Checkpoint layouts (w = (q - zero) * scale, q and zero unsigned 0..15):
  gptq: qweight [K/8, N] (8 input rows per int32), qzeros [K/G, N/8] (8 columns per int32;
    format v1 stores zero - 1), scales [K/G, N], g_idx [K] (group of each input row);
  awq: qweight [K, N/8] and qzeros [K/G, N/8] with columns in nibble order 0 2 4 6 1 3 5 7,
    scales [K/G, N];
  compressed-tensors: weight_packed [N, K/8] (q + 8 of signed q), weight_scale [N, K/G],
    weight_zero_point [N/8, K/G] (asymmetric only, packed along N), weight_g_idx [K].
Act-order checkpoints (g_idx not sorted) are repacked with input rows sorted by group, and
the activations are permuted to match at run time (one gather per layer).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from folio.kernels.w4a16_gemm import PACK, pack_rows, unpack_rows, w4a16_linear
from folio.layers.quantization.base import LinearMethod, new_param

Layout = Literal["gptq", "gptq_v2", "awq", "compressed-tensors", "rtn"]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's nibble j holds column 8i + AWQ_ORDER[j]


def unpack_cols(packed: torch.Tensor, order: tuple[int, ...] = tuple(range(PACK))) -> torch.Tensor:
    """[R, C/8] int32 -> [R, C] uint8 (0..15); nibble j of word i is column 8i + order[j]."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C/8, 8], nibble order
    inverse = [order.index(c) for c in range(PACK)]
    return nibbles[..., inverse].reshape(packed.shape[0], -1).to(torch.uint8)


def rtn_quantize(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest of w [N, K]: (q [K, N] uint8 0..15, scales [K/G, N] float32)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group_size, group_size)
    scales = (groups.abs().amax(-1) / 7).clamp(min=1e-10)  # [N, K/G]
    q = (groups / scales[..., None]).round().clamp(-8, 7) + 8
    return q.reshape(n, k).t().to(torch.uint8), scales.t().contiguous()


def _packed(layer: nn.Module, name: str, shape: tuple[int, int], **attrs: int) -> None:
    """An int32 tensor holding 8 int4 values per element along attrs["packed_dim"]."""
    new_param(layer, name, shape, torch.int32, pack_factor=PACK, **attrs)


def _g_idx(layer: nn.Module, name: str, k: int, one_group: bool, shards: int) -> None:
    """The group of each input row, one row per merged shard (act order must agree across
    shards to fuse them; it does in real checkpoints, as shards share their input). Without
    one in the checkpoint, groups are consecutive."""
    new_param(layer, name, (shards, k), torch.int32, input_dim=1, shard_scale=True, optional=True)
    getattr(layer, name).data.copy_(_consecutive_groups(layer, one_group).expand(shards, k))


def _consecutive_groups(layer: nn.Module, one_group: bool) -> torch.Tensor:
    """[K per rank] the group of each of this rank's input rows without act order: row i in
    group first + i // G, first being the group its input slice starts in (g_idx values are
    global; 0 when one group spans all of K)."""
    start, k = layer.input_slice()
    first = 0 if one_group else start // layer.w4_group_size
    return first + torch.arange(k) // layer.w4_group_size


def _one_g_idx(layer: nn.Module, g_idx: torch.Tensor) -> torch.Tensor:
    if not bool((g_idx == g_idx[0]).all()):
        raise ValueError(
            f"{layer.prefix}: the merged shards have different act-order g_idx; folio runs them "
            "as one matmul and needs one input order."
        )
    return g_idx[0]


def _check_act_order_unsharded(layer: nn.Module) -> None:
    """Act order on a row-parallel rank: its input rows fall in arbitrary groups, not whole
    groups of G, which the kernel's layout (row i in group i // G after sorting) cannot hold."""
    if layer.role == "row" and layer.tp_size > 1:
        raise ValueError(
            f"{layer.prefix}: act-order (desc_act) INT4 weights cannot be split over "
            f"{layer.tp_size} tensor-parallel ranks along their input (row-parallel layers); "
            "use tensor_parallel_size=1 or a checkpoint quantized without act order."
        )


class W4A16LinearMethod(LinearMethod):
    """4-bit weights in groups of `group_size` input rows (-1: one group per column)."""

    name = "int4-w4a16"

    def __init__(self, layout: Layout, group_size: int, symmetric: bool, desc_act: bool = False) -> None:
        self.layout = layout
        self.group_size = group_size
        self.symmetric = symmetric
        self.desc_act = desc_act

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        k, n = input_size_per_partition, sum(output_partition_sizes)
        g = self.group_size if self.group_size > 0 else k
        what = layer.prefix or "a linear layer"
        if k % g or g % 32:
            raise ValueError(f"{what}: INT4 needs the input size ({k}) in whole groups of {g}, a multiple of 32.")
        if any(size % PACK for size in output_partition_sizes):
            raise ValueError(f"{what}: INT4 needs output sizes {output_partition_sizes} in multiples of 8.")
        layer.w4_group_size = g
        groups, f32 = k // g, torch.float32  # scales load in float32: fp16 -> bf16 would round
        # One group over all of K (group_size -1): the checkpoint's single scale/zero row covers
        # every rank's input slice, so a row-parallel rank keeps it whole rather than slicing it.
        g_in, g_in_t = (0, 1) if self.group_size > 0 else (None, None)  # input axis of [K/G, N] / [N, K/G]
        if self.layout == "rtn":
            new_param(layer, "weight", (n, k), params_dtype, output_dim=0, input_dim=1)
        elif self.layout in ("gptq", "gptq_v2"):
            _packed(layer, "qweight", (k // PACK, n), input_dim=0, output_dim=1, packed_dim=0)
            _packed(layer, "qzeros", (groups, n // PACK), input_dim=g_in, output_dim=1, packed_dim=1, group_size=g)
            new_param(layer, "scales", (groups, n), f32, input_dim=g_in, output_dim=1, group_size=g)
            _g_idx(layer, "g_idx", k, self.group_size <= 0, len(output_partition_sizes))
        elif self.layout == "awq":
            _packed(layer, "qweight", (k, n // PACK), input_dim=0, output_dim=1, packed_dim=1)
            _packed(layer, "qzeros", (groups, n // PACK), input_dim=g_in, output_dim=1, packed_dim=1, group_size=g)
            new_param(layer, "scales", (groups, n), f32, input_dim=g_in, output_dim=1, group_size=g)
        else:
            _packed(layer, "weight_packed", (n, k // PACK), output_dim=0, input_dim=1, packed_dim=1)
            new_param(layer, "weight_scale", (n, groups), f32, output_dim=0, input_dim=g_in_t, group_size=g)
            if not self.symmetric:
                _packed(layer, "weight_zero_point", (n // PACK, groups), output_dim=0, input_dim=g_in_t, packed_dim=0, group_size=g)
            if self.desc_act:
                _g_idx(layer, "weight_g_idx", k, self.group_size <= 0, len(output_partition_sizes))

    # ---- repack into the kernel's layout ------------------------------------------------------
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scales, zeros, g_idx = self._unpacked(layer)  # [K, N] u8, [K/G, N] f32, [K/G, N] u8 | None, [K] | None
        for name in [n for n, _ in layer.named_parameters(recurse=False) if n != "bias"]:
            delattr(layer, name)
        perm = None
        if g_idx is not None and not torch.equal(g_idx.long().cpu(), _consecutive_groups(layer, self.group_size <= 0)):
            _check_act_order_unsharded(layer)
            perm = torch.argsort(g_idx.long(), stable=True)  # input rows sorted by group
            q = q[perm]
        frozen = lambda t: nn.Parameter(t.contiguous(), requires_grad=False)  # noqa: E731
        layer.w4_qweight = frozen(pack_rows(q))  # [K/8, N]
        layer.w4_scales = frozen(scales.float())  # [K/G, N]
        layer.w4_zeros = frozen(zeros) if zeros is not None else None
        layer.w4_perm = frozen(perm.to(torch.int64)) if perm is not None else None

    def _unpacked(self, layer: nn.Module):
        if self.layout == "rtn":
            q, scales = rtn_quantize(layer.weight.data, layer.w4_group_size)
            return q, scales, None, None
        if self.layout in ("gptq", "gptq_v2"):
            zeros = unpack_cols(layer.qzeros.data).int() + (1 if self.layout == "gptq" else 0)
            zeros = None if self.symmetric else zeros.to(torch.uint8)
            return unpack_rows(layer.qweight.data), layer.scales.data, zeros, _one_g_idx(layer, layer.g_idx.data)
        if self.layout == "awq":
            q = unpack_cols(layer.qweight.data, AWQ_ORDER)  # [K, N]
            zeros = None if self.symmetric else unpack_cols(layer.qzeros.data, AWQ_ORDER)
            return q, layer.scales.data, zeros, None
        q = unpack_cols(layer.weight_packed.data).t()  # [K, N]
        zeros = None
        if not self.symmetric:
            # [N/8, K/G] packed along N: transposed, it is column-packed [K/G, N/8].
            zeros = unpack_cols(layer.weight_zero_point.data.t().contiguous())  # [K/G, N]
        g_idx = _one_g_idx(layer, layer.weight_g_idx.data) if self.desc_act else None
        return q, layer.weight_scale.data.t(), zeros, g_idx

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # [tokens, K]
        if layer.w4_perm is not None:
            x2 = x2.index_select(1, layer.w4_perm)  # columns in the repacked row order
        out = w4a16_linear(x2, layer.w4_qweight, layer.w4_scales, layer.w4_zeros, layer.w4_group_size, bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])  # [..., N]
