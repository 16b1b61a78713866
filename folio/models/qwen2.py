"""Qwen2 / Qwen2.5: Llama with q, k and v biases and optional sliding windows on later layers."""

from __future__ import annotations

from typing import Any

from folio.models.llama import LlamaArgs, LlamaForCausalLM, llama_args


def qwen_sliding_windows(hf_config: dict[str, Any]) -> tuple[int | None, ...]:
    """Per-layer windows the way transformers' Qwen2/Qwen3 configs define them.

    A window exists only with use_sliding_window; it applies to the layers that layer_types
    marks "sliding_attention", or, without layer_types, to layers >= max_window_layers.
    """
    num_layers = int(hf_config["num_hidden_layers"])
    window = hf_config.get("sliding_window", 4096) if hf_config.get("use_sliding_window") else None
    if not window:
        return (None,) * num_layers
    first_sliding = int(hf_config.get("max_window_layers", 28))
    layer_types = hf_config.get("layer_types") or [
        "sliding_attention" if i >= first_sliding else "full_attention" for i in range(num_layers)
    ]
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers.")
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def args_from_hf(cls, hf_config: dict[str, Any]) -> LlamaArgs:
        return llama_args(
            hf_config,
            max_position=int(hf_config.get("max_position_embeddings", 32768)),
            qkv_bias=True,
            o_bias=False,
            mlp_bias=False,
            sliding_windows=qwen_sliding_windows(hf_config),
        )
