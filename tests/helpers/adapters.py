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


def two_adapter_case(root: str | os.PathLike, wide_rank: int, max_new: int) -> tuple[str, list[list[int]], dict, dict]:
    """A tiny Llama with two PEFT adapters ("small": rank 4 on q/v/down; "wide": wide_rank on
    every projection, rsLoRA), three prompts (5, 40 and 23 tokens) and PEFT's greedy tokens
    for each under the base model and each adapter: (base, prompts, refs, LoRARequests)."""
    import os.path
    import random

    from folio.lora.request import LoRARequest
    from tests.helpers.checkpoints import make_tiny_checkpoint

    base = make_tiny_checkpoint("llama", os.path.join(root, "base"))
    small = make_peft_adapter(base, os.path.join(root, "small"), seed=1, r=4, lora_alpha=8,
                              target_modules=["q_proj", "v_proj", "down_proj"])
    wide = make_peft_adapter(base, os.path.join(root, "wide"), seed=2, r=wide_rank, lora_alpha=4, use_rslora=True)
    rng = random.Random(0)
    # 40 tokens = 2 full blocks of 16 shared by every copy of a prompt (prefix cache).
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 40, 23)]
    refs = {name: peft_greedy(base, path, prompts, max_new) for name, path in
            (("base", None), ("small", small), ("wide", wide))}
    adapters = {"small": LoRARequest("small", 1, small), "wide": LoRARequest("wide", 2, wide)}
    return base, prompts, refs, adapters
