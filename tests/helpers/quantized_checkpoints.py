"""Quantized tiny checkpoints: compressed-tensors ones written by compressed-tensors itself, GPTQ
and AWQ ones written from their documented layouts with round-to-nearest (RTN) quantization.

compressed-tensors: its own apply_quantization_config attaches the scheme, calculate_qparams
computes the scales from min/max (static input scales from a calibration pass), and its
ModelCompressor packs and saves, as llm-compressor does after calibration.
GPTQ (AutoGPTQ "gptq" v1 format): qweight [K/8, N] int32 packing 8 rows per int32 (row 8i+j in
bits 4j), qzeros [K/G, N/8] packing 8 columns, storing zero - 1; scales [K/G, N]; g_idx [K].
AWQ (AutoAWQ GEMM): qweight [K, N/8] and qzeros [K/G, N/8] packing 8 columns in the order
0, 2, 4, 6, 1, 3, 5, 7; scales [K/G, N]; zero stored as is.
Each writer also returns the dequantized weights, so transformers can be run on exactly the
weights the quantized checkpoint stands for where it cannot read the format itself.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_INPUT_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---- compressed-tensors ---------------------------------------------------------------------
def write_compressed_tensors(
    src: str,
    dst: str,
    preset: str,
    group_size: int | None = None,
    calib_ids: list[int] | None = None,
    ignore: tuple[str, ...] = (),
    actorder: str | None = None,
) -> str:
    """Quantize the float checkpoint `src` with a compressed-tensors preset (FP8_DYNAMIC, FP8,
    W4A16, W4A16_ASYM) and save it, compressed, to `dst`."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    input_amax = _calibrate(model, calib_ids or list(range(3, 60)))
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group_size is not None:
        scheme.weights.group_size = group_size
    if actorder is not None:  # "weight": calibration order only, the layout stays as without
        scheme.weights.actorder = actorder
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", *ignore]))
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None:
            _set_qparams(module, input_amax.get(name))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(dst)
    _copy_tokenizer_files(src, dst)
    compressor.decompress_model(model)  # compressed-tensors' own dequantization: the reference
    _save_float(src, dst + "-dequantized", {
        name: t for name, t in model.state_dict().items() if name.endswith(("weight", "bias"))
    })
    return dst


def _save_float(src: str, folder: str, tensors: dict[str, torch.Tensor], qc: dict | None = None) -> None:
    """Save `tensors` with src's config (plus a quantization_config when given) and tokenizer."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if qc is not None:
        config["quantization_config"] = qc
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    _copy_tokenizer_files(src, folder)


def _calibrate(model: torch.nn.Module, ids: list[int]) -> dict[str, torch.Tensor]:
    """amax of each linear layer's input over one forward pass (for static input scales)."""
    amax: dict[str, torch.Tensor] = {}
    hooks = [
        module.register_forward_pre_hook(
            lambda m, args, name=name: amax.__setitem__(name, args[0].abs().amax().reshape(1))
        )
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    return amax


def _set_qparams(module: torch.nn.Module, input_amax: torch.Tensor | None) -> None:
    from compressed_tensors.quantization.utils import calculate_qparams

    w, args = module.weight.data, module.quantization_scheme.weights
    if args.strategy == "channel":
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    elif args.strategy == "tensor":
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    else:
        groups = w.reshape(w.shape[0], -1, args.group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
    if hasattr(module, "input_scale"):
        act = module.quantization_scheme.input_activations
        scale, _ = calculate_qparams(-input_amax, input_amax, act)
        module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))


def _copy_tokenizer_files(src: str, dst: str) -> None:
    for name in os.listdir(src):
        if name.startswith("tokenizer") or name == "special_tokens_map.json":
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


# ---- RTN int4 ----------------------------------------------------------------------------------
def rtn_int4(w: torch.Tensor, group_size: int, symmetric: bool) -> tuple[torch.Tensor, ...]:
    """[N, K] float -> (q [N, K] in 0..15, scale [N, K/G], zero [N, K/G] in 0..15), with
    w ~= (q - zero) * scale; symmetric uses zero = 8 and scale = amax / 7."""
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    if symmetric:
        scale = (g.abs().amax(-1) / 7).clamp(min=1e-8)
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        zero = (-lo / scale).round().clamp(0, 15)
    scale = scale.half().float()  # checkpoints store fp16 scales; dequantize with those
    q = (g / scale[..., None] + zero[..., None]).round().clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scale, zero.to(torch.int32)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    expand = lambda t: t.repeat_interleave(group_size, dim=1)  # noqa: E731  [N, K/G] -> [N, K]
    return (q.float() - expand(zero).float()) * expand(scale).float()


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """[R, C] in 0..15 -> [R/8, C] int32, row 8i+j in bits 4j of row i (GPTQ's qweight)."""
    r, c = values.shape
    v = values.reshape(r // 8, 8, c).to(torch.int64) & 0xF
    packed = sum(v[:, j] << (4 * j) for j in range(8))
    return _to_int32(packed)


def pack_cols(values: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """[R, C] in 0..15 -> [R, C/8] int32; nibble j holds column 8i + order[j]."""
    r, c = values.shape
    v = values.reshape(r, c // 8, 8).to(torch.int64) & 0xF  # GPTQ v1's zero - 1 = -1 wraps to 15
    packed = sum(v[:, :, order[j]] << (4 * j) for j in range(8))
    return _to_int32(packed)


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def write_int4(src: str, dst: str, fmt: str, group_size: int, symmetric: bool, desc_act: bool = False) -> str:
    """Write `src`'s linear layers as a GPTQ or AWQ checkpoint to `dst`; also write the
    dequantized float checkpoint to dst + "-dequantized" (the transformers reference)."""
    from safetensors.torch import load_file

    state = {}
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(src, name)))
    out, dequantized = {}, {}
    gen = torch.Generator().manual_seed(1)
    perms: dict[tuple[str, str | None], torch.Tensor] = {}
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or module.rpartition(".")[2] not in LINEAR_NAMES:
            out[name] = dequantized[name] = tensor
            continue
        n, k = tensor.shape
        group = k if group_size == -1 else group_size  # -1: one group over all input features
        g_idx = torch.arange(k) // group
        if desc_act:  # act order: a permutation of the input channels, shared by layers that
            # share their input (q/k/v, gate/up), as GPTQ's order comes from the input statistics
            key = (module.rpartition(".")[0], _INPUT_OF.get(module.rpartition(".")[2]))
            perms.setdefault(key, torch.randperm(k, generator=gen))
            g_idx = g_idx[perms[key]]
        q, scale, zero, w = _rtn_by_gidx(tensor.float(), g_idx, group, symmetric)
        dequantized[name] = w.to(tensor.dtype)
        out.update(_int4_tensors(module, fmt, q, scale, zero, g_idx))
    _save_float(src, dst, out, _int4_config(fmt, group_size, symmetric, desc_act))
    _save_float(src, dst + "-dequantized", dequantized)
    return dst


def _rtn_by_gidx(w: torch.Tensor, g_idx: torch.Tensor, group_size: int, symmetric: bool):
    """RTN with input channel c in group g_idx[c]: quantize the channels sorted by group."""
    perm = torch.argsort(g_idx, stable=True)
    q_sorted, scale, zero = rtn_int4(w[:, perm], group_size, symmetric)
    deq_sorted = dequantize_int4(q_sorted, scale, zero, group_size)
    inverse = torch.argsort(perm)
    return q_sorted[:, inverse], scale, zero, deq_sorted[:, inverse]


def _int4_tensors(module: str, fmt: str, q, scale, zero, g_idx) -> dict[str, torch.Tensor]:
    """q [N, K], scale/zero [N, K/G] -> the checkpoint tensors of one layer in `fmt`."""
    scales = scale.t().contiguous().to(torch.float16)  # [K/G, N]
    if fmt == "gptq":
        return {
            f"{module}.qweight": pack_rows(q.t().contiguous()),  # [K/8, N]
            f"{module}.qzeros": pack_cols(zero.t().contiguous() - 1),  # [K/G, N/8], zero - 1
            f"{module}.scales": scales,
            f"{module}.g_idx": g_idx.to(torch.int32),
        }
    return {
        f"{module}.qweight": pack_cols(q.t().contiguous(), AWQ_ORDER),  # [K, N/8]
        f"{module}.qzeros": pack_cols(zero.t().contiguous(), AWQ_ORDER),  # [K/G, N/8]
        f"{module}.scales": scales,
    }


def _int4_config(fmt: str, group_size: int, symmetric: bool, desc_act: bool) -> dict:
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "sym": symmetric,
                "desc_act": desc_act, "checkpoint_format": "gptq"}
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": not symmetric,
            "version": "gemm"}
