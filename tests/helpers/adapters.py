"""PEFT adapters for the tiny checkpoints, saved by peft itself, and peft's greedy reference.

init_lora_weights=False draws B at random too (PEFT's default leaves B zero, which would make
an adapter a no-op and hide every mistake); the draw is scaled up so that an adapter changes
greedy tokens visibly.
"""

from __future__ import annotations

import os
from typing import Any

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_peft_adapter(base_path: str, path: str | os.PathLike, *, seed: int, scale: float = 3.0, **lora_kwargs: Any) -> str:
    """Save a LoRA adapter of the checkpoint at base_path; lora_kwargs go to peft's LoraConfig."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora_kwargs.setdefault("target_modules", ALL_MODULES)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora_kwargs))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale / param.shape[-1] ** 0.5)
    peft_model.save_pretrained(str(path))
    return str(path)


def peft_greedy(base_path: str, adapter_path: str | None, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Greedy tokens of transformers + PeftModel (the base model alone when adapter_path is None)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    model.eval()
    out = []
    for ids in prompts:
        generated = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(generated[0, len(ids):].tolist())
    return out
