"""LoRAAdapter: one PEFT adapter folder read into per-module (A, B) CPU tensors, checked once.

PEFT writes `adapter_config.json` and `adapter_model.safetensors` (older versions
`adapter_model.bin`), with tensors named `base_model.model.<module>.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r]. Its forward is y = base(x) + lora_B(lora_A(x)) * scaling with
scaling = lora_alpha / r, or lora_alpha / sqrt(r) under rsLoRA; the scaling is folded into B
here, so the kernels compute only (x A^T) B^T.

Everything an adapter could be refused for is refused here, before it takes a GPU slot: a
missing file, a rank above max_lora_rank, a module the model lacks or folio does not adapt,
shapes of another base model, and PEFT features that change the forward (DoRA, trained biases,
modules_to_save, per-module rank/alpha patterns). `fan_in_fan_out` only changes how PEFT merges
into a Conv1D weight, never the forward of a Linear (PEFT itself turns it off there): ignored.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

from folio.logger import init_logger
from folio.lora.request import LoRARequest
from folio.lora.targets import SUPPORTED_MODULES, LoRATarget

logger = init_logger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class LoRAModuleWeights:
    lora_a: torch.Tensor  # [r, in]
    lora_b: torch.Tensor  # [out, r], scaling folded in


@dataclass(frozen=True)
class LoRAAdapter:
    request: LoRARequest
    rank: int
    scaling: float
    modules: dict[str, LoRAModuleWeights]  # PEFT module name -> weights (CPU, model dtype)

    @property
    def num_bytes(self) -> int:
        return sum(w.lora_a.nbytes + w.lora_b.nbytes for w in self.modules.values())


def load_adapter(
    request: LoRARequest,
    targets: dict[str, LoRATarget],
    max_lora_rank: int,
    dtype: torch.dtype,
) -> LoRAAdapter:
    """Read and check the adapter folder; ValueError naming the problem otherwise."""
    config = read_adapter_config(request.lora_path)
    rank, scaling = check_adapter_config(config, max_lora_rank, request.lora_name)
    listed = config.get("target_modules")
    if isinstance(listed, (list, tuple)):  # a string is a regex PEFT matched: the weights tell
        check_target_names(listed, targets, request.lora_name)
    tensors = read_adapter_tensors(request.lora_path)
    modules = pair_modules(tensors, targets, rank, request.lora_name)
    cast = {
        name: LoRAModuleWeights(
            a.to(dtype).contiguous(),  # [r, in]
            (b.float() * scaling).to(dtype).contiguous(),  # [out, r]
        )
        for name, (a, b) in modules.items()
    }
    return LoRAAdapter(request, rank, scaling, cast)


def read_adapter_config(path: str) -> dict:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter folder {path!r} does not exist.")
    if not os.path.isfile(config_path):
        raise ValueError(f"LoRA adapter folder {path!r} has no {CONFIG_FILE}.")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Cannot read {config_path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object.")
    return config


def check_adapter_config(config: dict, max_lora_rank: int, name: str) -> tuple[int, float]:
    """(rank, scaling) of a plain LoRA adapter, or ValueError for what folio cannot apply."""
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"Adapter {name!r} is a {peft_type} adapter; folio serves LoRA adapters only.")
    unsupported = {
        "use_dora": bool(config.get("use_dora")),
        "modules_to_save": bool(config.get("modules_to_save")),
        "bias": config.get("bias", "none") not in (None, "none"),
        "lora_bias": bool(config.get("lora_bias")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "layer_replication": bool(config.get("layer_replication")),
    }
    refused = [key for key, present in unsupported.items() if present]
    if refused:
        raise ValueError(f"Adapter {name!r} uses {', '.join(refused)}, which folio does not support.")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"Adapter {name!r}: r must be a positive integer, got {rank!r}.")
    if rank > max_lora_rank:
        raise ValueError(f"Adapter {name!r} has rank {rank}, more than max_lora_rank={max_lora_rank}.")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"Adapter {name!r}: lora_alpha must be a number, got {alpha!r}.")
    if config.get("fan_in_fan_out"):
        logger.info("Adapter %r: fan_in_fan_out is ignored for Linear layers, as PEFT does.", name)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def read_adapter_tensors(path: str) -> dict[str, torch.Tensor]:
    for file_name in WEIGHT_FILES:
        file_path = os.path.join(path, file_name)
        if not os.path.isfile(file_path):
            continue
        try:
            if file_name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(file_path, device="cpu")
            return torch.load(file_path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - a corrupt file is the user's error, said plainly
            raise ValueError(f"Cannot read LoRA weights {file_path}: {e}") from None
    raise ValueError(f"LoRA adapter folder {path!r} has no {' or '.join(WEIGHT_FILES)}.")


def pair_modules(
    tensors: dict[str, torch.Tensor], targets: dict[str, LoRATarget], rank: int, name: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """PEFT module name -> (A [rank, in], B [out, rank]), each checked against its target."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"Adapter {name!r} holds {key!r}, which is not a LoRA A/B weight folio can apply.")
        halves.setdefault(match["module"], {})[match["ab"]] = tensor
    if not halves:
        raise ValueError(f"Adapter {name!r} holds no LoRA weights.")
    modules = {}
    for module, pair in sorted(halves.items()):
        target = _target_for(module, targets, name)
        if set(pair) != {"A", "B"}:
            raise ValueError(f"Adapter {name!r}: {module} has lora_{next(iter(pair))} without its other half.")
        a, b = pair["A"], pair["B"]
        expected_a, expected_b = (rank, target.input_size), (target.output_size, rank)
        if tuple(a.shape) != expected_a or tuple(b.shape) != expected_b:
            raise ValueError(
                f"Adapter {name!r}: {module} has A {tuple(a.shape)} and B {tuple(b.shape)}; this model "
                f"needs {expected_a} and {expected_b} (an adapter of another base model?)."
            )
        modules[module] = (a, b)
    return modules


def check_target_names(listed: list, targets: dict[str, LoRATarget], name: str) -> None:
    """Each target_modules entry must be a projection folio adapts and the model has."""
    present = {module.rpartition(".")[2] for module in targets}
    for entry in listed:
        leaf = str(entry).rpartition(".")[2]
        if leaf not in SUPPORTED_MODULES:
            raise ValueError(
                f"Adapter {name!r} targets {entry!r}; folio applies LoRA to {', '.join(SUPPORTED_MODULES)} only."
            )
        if leaf not in present:
            raise ValueError(f"Adapter {name!r} targets {entry!r}, which this model does not have.")


def _target_for(module: str, targets: dict[str, LoRATarget], name: str) -> LoRATarget:
    target = targets.get(module)
    if target is not None:
        return target
    leaf = module.rpartition(".")[2]
    if leaf not in SUPPORTED_MODULES:
        raise ValueError(f"Adapter {name!r} adapts {module}; folio applies LoRA to {', '.join(SUPPORTED_MODULES)} only.")
    raise ValueError(f"Adapter {name!r} adapts {module}, which this model does not have.")
