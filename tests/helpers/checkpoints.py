"""Tiny random Hugging Face checkpoints, saved by transformers itself so the layout is the real one.

Shapes avoid powers of two (odd GQA ratios, head_dim 20/28/40, vocab 1000). All parameters,
biases and norm scales included, are drawn at random: transformers initializes biases to 0 and
norms to 1, which would hide a bias or norm that is loaded into the wrong place. The scale (0.1)
makes attention far from uniform, so a wrong position or mask changes the logits visibly.
"""

from __future__ import annotations

import os
from typing import Any

import torch

VOCAB = 1000
MAX_POSITIONS = 512
SEED = 0
WEIGHT_STD = 0.1

_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS)

# kind -> (transformers config class name, config kwargs)
KIND_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 2 style plus both optional bias switches; 6 query heads share 2 kv heads.
    "llama": ("LlamaConfig", dict(
        hidden_size=120, intermediate_size=212, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=20, attention_bias=True, mlp_bias=True,
    )),
    # Llama 3.1 rope scaling with an original context short enough that all three bands occur.
    "llama3": ("LlamaConfig", dict(
        hidden_size=96, intermediate_size=164, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=3, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64),
    )),
    "mistral": ("MistralConfig", dict(
        hidden_size=112, intermediate_size=180, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=32,
    )),
    # Qwen2: q/k/v biases, one kv head for all five query heads (MQA), tied embeddings.
    "qwen2": ("Qwen2Config", dict(
        hidden_size=120, intermediate_size=200, num_hidden_layers=2, num_attention_heads=5,
        num_key_value_heads=1, tie_word_embeddings=True,
    )),
    # Qwen2 with sliding windows on the layers past max_window_layers only.
    "qwen2_swa": ("Qwen2Config", dict(
        hidden_size=120, intermediate_size=200, num_hidden_layers=2, num_attention_heads=5,
        num_key_value_heads=1, use_sliding_window=True, sliding_window=24, max_window_layers=1,
    )),
    # Qwen3: head_dim 40 while hidden / heads = 24.
    "qwen3": ("Qwen3Config", dict(
        hidden_size=96, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=40, tie_word_embeddings=True,
    )),
    "opt": ("OPTConfig", dict(
        hidden_size=120, ffn_dim=200, num_hidden_layers=2, num_attention_heads=6,
    )),
    # OPT-350m style: embeddings narrower than the model (project_in/out), post-block norms.
    "opt_proj": ("OPTConfig", dict(
        hidden_size=120, ffn_dim=200, num_hidden_layers=2, num_attention_heads=6,
        word_embed_proj_dim=88,
    )),
    "opt_post_ln": ("OPTConfig", dict(
        hidden_size=120, ffn_dim=200, num_hidden_layers=2, num_attention_heads=6,
        do_layer_norm_before=False,
    )),
}
KINDS = tuple(KIND_CONFIGS)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * WEIGHT_STD
            is_norm_scale = param.dim() == 1 and "norm" in name and name.endswith("weight")
            param.copy_(1.0 + noise if is_norm_scale else noise)


def make_tiny_checkpoint(
    kind: str,
    path: str | os.PathLike,
    *,
    save_dtype: torch.dtype = torch.float32,
    max_shard_size: str | int = "50GB",
    **overrides: Any,
) -> str:
    """Save a random model of `kind` (see KINDS) to `path`; overrides update its config kwargs."""
    import transformers

    if kind not in KIND_CONFIGS:
        raise ValueError(f"Unknown checkpoint kind {kind!r}; known: {', '.join(KINDS)}.")
    class_name, kwargs = KIND_CONFIGS[kind]
    config = getattr(transformers, class_name)(**{**_COMMON, **kwargs, **overrides})
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, SEED)
    model.to(save_dtype).save_pretrained(str(path), max_shard_size=max_shard_size)
    return str(path)


def convert_to_pytorch_bin(path: str | os.PathLike, legacy: bool = False) -> None:
    """Replace a folder's safetensors with one pytorch_model.bin of the same tensors.

    transformers 5 can no longer write .bin files, yet older hub checkpoints ship only those;
    legacy=True writes the pre-zip format of torch < 1.6, which cannot be memory-mapped.
    """
    from safetensors.torch import load_file

    folder = str(path)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(folder, name)))
            os.remove(os.path.join(folder, name))
        elif name == "model.safetensors.index.json":
            os.remove(os.path.join(folder, name))
    target = os.path.join(folder, "pytorch_model.bin")
    torch.save(state, target, _use_new_zipfile_serialization=not legacy)


def tiny_model_dir(tmp_path_factory: Any, kind: str = "llama", name: str | None = None) -> str:
    """A tiny random checkpoint of `kind` with the test tokenizer, in a fresh temporary folder
    named `name` (default: kind): what most engine, server and compat tests start from."""
    from tests.helpers.tokenizers import save_test_tokenizer

    path = str(tmp_path_factory.mktemp(name or kind))
    make_tiny_checkpoint(kind, path)
    save_test_tokenizer(path)
    return path
