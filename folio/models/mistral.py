"""Mistral: Llama with a sliding attention window on every layer and no biases."""

from __future__ import annotations

from typing import Any

from folio.models.llama import LlamaArgs, LlamaForCausalLM, llama_args


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def args_from_hf(cls, hf_config: dict[str, Any]) -> LlamaArgs:
        # transformers' MistralConfig defaults sliding_window to 4096 when the key is absent;
        # an explicit null (Mistral v0.2 and later) means full attention.
        window = hf_config.get("sliding_window", 4096)
        num_layers = int(hf_config["num_hidden_layers"])
        return llama_args(
            hf_config,
            max_position=int(hf_config.get("max_position_embeddings", 4096 * 32)),
            qkv_bias=False,
            o_bias=False,
            mlp_bias=False,
            sliding_windows=(int(window) if window else None,) * num_layers,
        )
