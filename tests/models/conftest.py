"""Shared fixtures for model tests: one tiny checkpoint per kind and transformers' logits for it."""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.config.model import ModelConfig
from folio.models.base import CausalLM
from folio.models.loader import load_model
from tests.helpers.checkpoints import make_tiny_checkpoint


def load_folio(
    path: str,
    load_format: str = "auto",
    dtype: str = "float32",
    seed: int = 0,
    quantization: str | None = None,
) -> CausalLM:
    config = ModelConfig.create(
        path, dtype=dtype, device="cpu", load_format=load_format, seed=seed, quantization=quantization
    )
    return load_model(config, torch.device("cpu"), TorchAttentionBackend())


def hf_logits(path: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' model(input_ids).logits in float32, one prompt at a time: [len, vocab] each."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in prompts]


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """kind -> folder, each made once per session."""
    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = make_tiny_checkpoint(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    return get
