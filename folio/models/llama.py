"""Llama and the decoders shaped like it (Mistral, Qwen2, Qwen3): pre-norm, RoPE, gated SiLU MLP.

The family differs only in what LlamaArgs records (biases, q/k norms, sliding windows), so each
architecture is a subclass that reads its own config keys and defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from folio.attention.backends.base import AttentionBackend
from folio.attention.metadata import AttentionMetadata
from folio.layers.activation import gated_activation
from folio.layers.attention import Attention
from folio.layers.layernorm import RMSNorm
from folio.layers.linear import MergedColumnLinear, QKVLinear, RowParallelLinear
from folio.layers.quantization.base import QuantizationConfig
from folio.layers.rotary_embedding import RotaryEmbedding, get_rope, rope_parameters_from_hf
from folio.layers.vocab_embedding import LMHead, VocabEmbedding
from folio.models.base import CausalLM
from folio.models.weight_utils import GATE_UP_STACKED, QKV_STACKED, load_params


@dataclass(frozen=True)
class LlamaArgs:
    """The shapes and switches of one Llama-family checkpoint, read once from config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope: dict[str, Any]
    hidden_act: str
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: per-head RMSNorm of q and k before rope
    sliding_windows: tuple[int | None, ...]  # one per layer; None = full attention


def llama_args(hf: dict[str, Any], **overrides: Any) -> LlamaArgs:
    """LlamaArgs with transformers' LlamaConfig defaults for keys config.json leaves out."""
    num_heads = int(hf["num_attention_heads"])
    num_layers = int(hf["num_hidden_layers"])
    attention_bias = bool(hf.get("attention_bias", False))
    fields: dict[str, Any] = dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 2048)),
        rope=rope_parameters_from_hf(hf),
        hidden_act=str(hf.get("hidden_act", "silu")),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=False,
        sliding_windows=(None,) * num_layers,
    )
    fields.update(overrides)
    return LlamaArgs(**fields)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        args: LlamaArgs,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.qkv_proj = QKVLinear(
            args.hidden_size,
            args.head_dim,
            args.num_heads,
            args.num_kv_heads,
            bias=args.qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        # This rank's heads (all of them at tp = 1): the attention and its KV cache hold only these.
        self.num_heads = self.qkv_proj.num_heads_per_rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads_per_rank
        self.o_proj = RowParallelLinear(
            args.num_heads * args.head_dim,
            args.hidden_size,
            bias=args.o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.rotary_emb = rotary_emb  # shared by all layers
        self.attn = Attention(
            self.num_heads,
            args.head_dim,
            args.head_dim**-0.5,
            self.num_kv_heads,
            backend,
            sliding_window=args.sliding_windows[layer_idx],
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))  # [tokens, H*D], [tokens, Hkv*D] x2
        cache = self.attn.fused_kv_write(v, attn_metadata)  # K/V stored by the rotary kernel on CUDA
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head norms, then rotary
            q, k, written = self.rotary_emb.norm_and_rotate(positions, q, k, self.q_norm, self.k_norm, cache)
        else:
            q, k, written = self.rotary_emb.rotate_and_store(positions, q, k, cache)
        out = self.attn(q, k, v, attn_metadata, kv_written=written)  # [tokens, H*D]
        return self.o_proj(out)  # [tokens, hidden]


class LlamaMLP(nn.Module):
    def __init__(
        self, args: LlamaArgs, quant_config: QuantizationConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        inter = args.intermediate_size
        self.gate_up_proj = MergedColumnLinear(
            args.hidden_size,
            [inter, inter],
            (0, 1),
            bias=args.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            inter,
            args.hidden_size,
            bias=args.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = gated_activation(args.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = getattr(self.gate_up_proj, "silu_and_mul", None)  # a LoRA layer: its delta inside the activation
        if fused is not None:
            return self.down_proj(fused(x))  # [tokens, hidden]
        # an FP8 down projection (never a LoRA-wrapped one) takes the activation quantized by its kernel
        fp8_down = getattr(self.down_proj, "takes_fp8_activation", False)
        return self.down_proj(self.act_fn(self.gate_up_proj(x), fp8_out=fp8_down))  # [tokens, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        args: LlamaArgs,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(
            args, layer_idx, rotary_emb, backend, quant_config, f"{prefix}.self_attn"
        )
        self.mlp = LlamaMLP(args, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,  # [tokens, hidden]: the previous layer's MLP output
        residual: torch.Tensor | None,  # [tokens, hidden]: the stream before it; None at layer 0
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fp8_qkv, fp8_mlp = self.fp8_inputs
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden, fp8_out=fp8_qkv)
        else:
            hidden, residual = self.input_layernorm(hidden, residual, fp8_out=fp8_qkv)
        hidden = self.self_attn(positions, hidden, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual, fp8_out=fp8_mlp)
        return self.mlp(hidden), residual

    @property
    def fp8_inputs(self) -> tuple[bool, bool]:
        """Whether QKV and gate/up take FP8 activations from the norms before them (an FP8 layer
        with per-token scales; never a LoRA-wrapped one, whose adapters read the 16-bit input)."""
        qkv, gate_up = self.self_attn.qkv_proj, self.mlp.gate_up_proj
        return getattr(qkv, "takes_fp8_activation", False), getattr(gate_up, "takes_fp8_activation", False)


class LlamaModel(nn.Module):
    def __init__(
        self,
        args: LlamaArgs,
        backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        rotary_emb = get_rope(args.head_dim, args.max_position, args.rope)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(args, i, rotary_emb, backend, quant_config, f"{prefix}.layers.{i}")
            for i in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [tokens, hidden]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn_metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(CausalLM):
    def __init__(
        self,
        hf_config: dict[str, Any],
        attn_backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
    ) -> None:
        super().__init__()
        self.args = self.args_from_hf(hf_config)
        self.model = LlamaModel(self.args, attn_backend, quant_config, "model")
        self.lm_head = LMHead(self.args.vocab_size, self.args.hidden_size)
        if self.args.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    @classmethod
    def args_from_hf(cls, hf_config: dict[str, Any]) -> LlamaArgs:
        return llama_args(hf_config)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        return self.lm_head(hidden_states, widen)  # [n, vocab] float32, or the model dtype

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_params(self, weights, QKV_STACKED + GATE_UP_STACKED)
