"""Reading checkpoint tensors and copying them into model parameters.

Checkpoints come as Hugging Face folders: *.safetensors (one file, or shards listed by
model.safetensors.index.json) or, when there are none, pytorch_model*.bin.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from folio.layers.checkpoint_slice import CheckpointSlice, as_tensor
from folio.layers.layernorm import LayerNorm, RMSNorm
from folio.layers.linear import check_shape
from folio.logger import init_logger

logger = init_logger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_INDEX = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class StackedParam:
    """Checkpoint matrices named `.{shard_name}.` load as shard `shard_id` of `.{param_name}.`."""

    param_name: str  # e.g. "qkv_proj"
    shard_name: str  # e.g. "q_proj"
    shard_id: str | int  # e.g. "q"


# The merged projections of every decoder we build: one QKV matmul, one gate_up matmul.
QKV_STACKED = (
    StackedParam("qkv_proj", "q_proj", "q"),
    StackedParam("qkv_proj", "k_proj", "k"),
    StackedParam("qkv_proj", "v_proj", "v"),
)
GATE_UP_STACKED = (
    StackedParam("gate_up_proj", "gate_proj", 0),
    StackedParam("gate_up_proj", "up_proj", 1),
)


# ---- which files --------------------------------------------------------------------------
def _indexed_files(folder: str, index_name: str) -> list[str] | None:
    index_path = os.path.join(folder, index_name)
    if not os.path.isfile(index_path):
        return None
    with open(index_path, encoding="utf-8") as f:
        weight_map = json.load(f).get("weight_map", {})
    # The index names the shards that belong to this checkpoint; other files are ignored.
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def safetensors_files(folder: str) -> list[str]:
    files = _indexed_files(folder, SAFETENSORS_INDEX)
    return files if files is not None else sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def pt_files(folder: str) -> list[str]:
    files = _indexed_files(folder, PT_INDEX)
    if files is not None:
        return files
    return sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))


def checkpoint_files(folder: str, load_format: str) -> tuple[str, list[str]]:
    """("safetensors" | "pt", files), or ValueError when the folder holds none of that format."""
    if load_format in ("auto", "safetensors"):
        files = safetensors_files(folder)
        if files:
            return "safetensors", files
    if load_format in ("auto", "pt"):
        files = pt_files(folder)
        if files:
            return "pt", files
    wanted = {"auto": "*.safetensors or pytorch_model*.bin", "safetensors": "*.safetensors"}
    expected = wanted.get(load_format, "pytorch_model*.bin")
    raise ValueError(
        f"No checkpoint weights in {folder!r}: expected {expected} "
        "(or pass load_format='dummy' for random weights)."
    )


# ---- reading ------------------------------------------------------------------------------
@contextlib.contextmanager
def _open_safetensors(path: str) -> Iterator[Any]:
    """safe_open, with a damaged file (truncated by an interrupted download or copy, or not
    safetensors at all) a ValueError naming it: SafetensorError is no ValueError, so the CLI
    printed a traceback that named only the header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            yield f
    except SafetensorError as e:
        raise ValueError(f"Cannot read checkpoint file {path}: {e}. The file is damaged or incomplete "
                         "(an interrupted download or copy?): fetch it again.") from None


def _read_safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    with _open_safetensors(path) as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


def _slice_safetensors(path: str) -> Iterator[tuple[str, CheckpointSlice]]:
    """Unread slices (tensor parallelism): each rank reads only the part it loads."""
    with _open_safetensors(path) as f:
        for name in f.keys():
            source = f.get_slice(name)
            yield name, CheckpointSlice(source, tuple(source.get_shape()))


def _read_pt(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    # weights_only: a .bin is a pickle, and only tensors may come out of it.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        # Files written before torch 1.6 are not zip archives and cannot be memory-mapped.
        state = torch.load(path, map_location="cpu", weights_only=True)
    yield from state.items()
    del state


def iterate_weights(files: Sequence[str], fmt: str, sliced: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor of every file, with a progress bar over shards.
    sliced (safetensors only): CheckpointSlices instead, read when copied (tensor parallelism)."""
    read = _read_safetensors if fmt == "safetensors" else _read_pt
    if sliced and fmt == "safetensors":
        read = _slice_safetensors  # type: ignore[assignment]
    for path in tqdm(files, desc="Loading checkpoint shards", unit="shard", leave=False):
        yield from read(path)


# ---- copying into the model ---------------------------------------------------------------
def _resolve(name: str, stacked: Sequence[StackedParam]) -> tuple[str, str | int | None]:
    for entry in stacked:
        marker = f".{entry.shard_name}."
        if marker in name:
            return name.replace(marker, f".{entry.param_name}."), entry.shard_id
    return name, None


def load_params(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[StackedParam] = (),
) -> set[str]:
    """Copy each checkpoint tensor into the parameter of the same name (dtype converted).

    Returns the parameter names fully loaded: a merged parameter counts once all its shards
    arrived. Names with no matching parameter (rotary inv_freq, a tied lm_head) are skipped.
    """
    params = dict(model.named_parameters())
    arrived: dict[str, set[str | int]] = {}
    loaded: set[str] = set()
    for name, tensor in weights:
        scale_targets = kv_scale_targets(name, params)
        if scale_targets:
            for target in scale_targets:
                params[target].data.fill_(_one_value(name, tensor))
                loaded.add(target)
            continue
        target, shard_id = _resolve(name, stacked)
        param = params.get(target)
        if param is None:
            logger.debug("Skipping checkpoint tensor %s: the model has no such parameter", name)
            continue
        weight_loader = getattr(param, "weight_loader", None)
        if weight_loader is not None:
            # A linear layer's parameter: its layer slices, packs and places the tensor.
            weight_loader(param, tensor, shard_id)
        elif shard_id is None:
            check_shape(name, param.shape, tensor)
            param.data.copy_(as_tensor(tensor))
        else:
            raise ValueError(f"{name} is a shard of {target}, which is not a merged layer.")
        if shard_id is None:
            loaded.add(target)
            continue
        arrived.setdefault(target, set()).add(shard_id)
        if arrived[target] >= set(param.shard_ids):  # type: ignore[attr-defined]
            loaded.add(target)
    return loaded


# Checkpoint names of the per-tensor FP8 KV cache scales, as vLLM maps them (its
# maybe_remap_kv_scale_name and compressed-tensors' get_cache_scale), to the attention layer's
# `<prefix>.attn.{k,v}_scale`: llm-compressor's `self_attn.k_scale` (newer) and
# `self_attn.k_proj.output_scale` (older), ModelOpt's `self_attn.k_proj.k_scale`, fused
# `self_attn.qkv_proj.k_scale`, and the deprecated single `self_attn.kv_scale` (both scales).
_KV_SCALE_NAMES = (
    re.compile(r"^(?P<prefix>.*)\.(?P<kv>[kv])_proj\.output_scale$"),
    re.compile(r"^(?P<prefix>.*)\.(?:[kv]|qkv)_proj\.(?P<kv>[kv])_scale$"),
    re.compile(r"^(?P<prefix>.*)\.(?P<kv>kv|k|v)_scale$"),
)


def kv_scale_targets(name: str, params: Mapping[str, nn.Parameter]) -> list[str]:
    """The attention scale parameters a checkpoint KV-scale tensor loads into ([] if `name` is
    not one, or the model has no such parameter: e.g. q_proj.output_scale, which folio has no
    use for)."""
    for pattern in _KV_SCALE_NAMES:
        match = pattern.match(name)
        if match is None:
            continue
        prefix = match["prefix"]
        kinds = ("k", "v") if match["kv"] == "kv" else (match["kv"],)
        for attn in (f"{prefix}.attn", prefix):  # the layer's Attention module, or the layer itself
            targets = [f"{attn}.{kind}_scale" for kind in kinds]
            if all(t in params for t in targets):
                return targets
    return []


def _one_value(name: str, tensor: torch.Tensor | CheckpointSlice) -> float:
    """A per-tensor scale, saved as shape () or (1,)."""
    if tensor.numel() != 1:
        raise ValueError(f"Checkpoint tensor {name} is a KV cache scale of shape {tuple(tensor.shape)}; "
                         "folio takes one per-tensor scale per layer.")
    return float(as_tensor(tensor).reshape(()))


def missing_params(model: nn.Module, loaded: set[str]) -> list[str]:
    """Parameters the checkpoint did not fill, less those a method marks `optional`."""
    return sorted(
        name
        for name, param in model.named_parameters()
        if name not in loaded and not getattr(param, "optional", False)
    )


# ---- random weights -----------------------------------------------------------------------
def initialize_dummy_weights(
    model: nn.Module, seed: int, low: float = -1e-3, high: float = 1e-3
) -> None:
    """Small uniform weights, repeatable for a seed and device; norms start as identity.

    Norm scales of 1 (and biases of 0) keep activations at a sane scale through the layers,
    so a dummy model runs through the same numeric ranges a trained one would.
    """
    norm_params = {
        id(p)
        for module in model.modules()
        if isinstance(module, (RMSNorm, LayerNorm))
        for p in module.parameters(recurse=False)
    }
    generator: torch.Generator | None = None
    for name, param in model.named_parameters():
        if getattr(param, "keep_init", False):
            continue
        if id(param) in norm_params:
            param.data.fill_(1.0 if name.endswith("weight") else 0.0)
            continue
        if not param.dtype.is_floating_point or param.element_size() == 1:
            param.data.zero_()  # packed integers or FP8 codes: no uniform_ for them
            continue
        if generator is None or generator.device != param.device:
            generator = torch.Generator(device=param.device).manual_seed(seed)
        param.data.uniform_(low, high, generator=generator)
