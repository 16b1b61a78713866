"""Qwen3: Llama with per-head RMSNorm of q and k before rope, and an explicit head_dim."""

from __future__ import annotations

from typing import Any

from folio.models.llama import LlamaArgs, LlamaForCausalLM, llama_args
from folio.models.qwen2 import qwen_sliding_windows


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def args_from_hf(cls, hf_config: dict[str, Any]) -> LlamaArgs:
        return llama_args(
            hf_config,
            max_position=int(hf_config.get("max_position_embeddings", 32768)),
            mlp_bias=False,
            qk_norm=True,
            sliding_windows=qwen_sliding_windows(hf_config),
        )
