"""load_model: build the architecture a ModelConfig names and fill its weights."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from folio.attention.backends.base import AttentionBackend
from folio.config.model import ModelConfig
from folio.layers.quantization import get_quantization_config, process_weights_after_loading
from folio.logger import init_logger
from folio.models.base import CausalLM
from folio.parallel import get_tp_size
from folio.models.registry import get_model_class
from folio.models.weight_utils import (
    checkpoint_files,
    initialize_dummy_weights,
    iterate_weights,
    missing_params,
)

logger = init_logger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    model_config: ModelConfig, device: torch.device, attn_backend: AttentionBackend
) -> CausalLM:
    """The architecture's modules in the model dtype on `device`, weights uninitialized."""
    cls = get_model_class(model_config.architecture)
    quant_config = get_quantization_config(model_config)
    with _default_dtype(_TORCH_DTYPES[model_config.dtype]), torch.device(device):
        return cls(model_config.hf_config, attn_backend, quant_config=quant_config)


def load_checkpoint(model: CausalLM, model_config: ModelConfig) -> None:
    """Copy the checkpoint into `model`, or ValueError naming the parameters it lacks."""
    fmt, files = checkpoint_files(model_config.model, model_config.load_format)
    # Under tensor parallelism each rank reads only its slices of the safetensors files.
    loaded = model.load_weights(iterate_weights(files, fmt, sliced=get_tp_size() > 1))
    missing = missing_params(model, loaded)
    if missing:
        shown = ", ".join(missing[:10])
        if len(missing) > 10:
            shown += f" and {len(missing) - 10} more"
        raise ValueError(
            f"The checkpoint in {model_config.model!r} lacks weights for {len(missing)} parameters "
            f"of {model_config.architecture}: {shown}."
        )


def load_model(
    model_config: ModelConfig, device: torch.device, attn_backend: AttentionBackend
) -> CausalLM:
    start = time.perf_counter()
    model = build_model(model_config, device, attn_backend)
    if model_config.load_format == "dummy":
        initialize_dummy_weights(model, model_config.seed)
    else:
        load_checkpoint(model, model_config)
    methods = process_weights_after_loading(model)
    logger.info("Linear layers by method: %s", methods)
    for layer in model.attention_layers():
        layer.process_weights_after_loading()
    model.eval().requires_grad_(False)
    num_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Loaded %s (%s parameters, %s) on %s in %.2f s%s",
        model_config.architecture,
        _human(num_params),
        model_config.dtype,
        device,
        time.perf_counter() - start,
        ", dummy weights" if model_config.load_format == "dummy" else "",
    )
    return model


def _human(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)
