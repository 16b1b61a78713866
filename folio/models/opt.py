"""OPT (facebook/opt-*): learned positions, LayerNorm, ReLU MLP, biases everywhere.

do_layer_norm_before=True (125m, 1.3b, ...) normalizes before each block; False (350m)
normalizes after each residual add. When word_embed_proj_dim differs from hidden_size the
embeddings live in the smaller space and project_in/project_out translate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from folio.attention.backends.base import AttentionBackend
from folio.attention.metadata import AttentionMetadata
from folio.layers.activation import Activation
from folio.layers.attention import Attention
from folio.layers.layernorm import LayerNorm
from folio.layers.linear import ColumnParallelLinear, Linear, QKVLinear, RowParallelLinear
from folio.layers.quantization.base import QuantizationConfig
from folio.layers.vocab_embedding import LMHead, VocabEmbedding
from folio.models.base import CausalLM
from folio.models.weight_utils import QKV_STACKED, load_params

# OPT reserves the first two rows of its position table (a fairseq padding convention).
POSITION_OFFSET = 2


@dataclass(frozen=True)
class OPTArgs:
    vocab_size: int
    hidden_size: int
    ffn_dim: int
    num_layers: int
    num_heads: int
    max_position: int
    word_embed_proj_dim: int
    do_layer_norm_before: bool
    final_layer_norm: bool
    activation: str
    bias: bool
    norm_affine: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> OPTArgs:
        """Defaults are transformers' OPTConfig defaults."""
        hidden = int(hf["hidden_size"])
        before = bool(hf.get("do_layer_norm_before", True))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            ffn_dim=int(hf.get("ffn_dim", 3072)),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=int(hf["num_attention_heads"]),
            max_position=int(hf.get("max_position_embeddings", 2048)),
            word_embed_proj_dim=int(hf.get("word_embed_proj_dim") or hidden),
            do_layer_norm_before=before,
            final_layer_norm=before and not hf.get("_remove_final_layer_norm", False),
            activation=str(hf.get("activation_function", "relu")),
            bias=bool(hf.get("enable_bias", True)),
            norm_affine=bool(hf.get("layer_norm_elementwise_affine", True)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        )


class OPTAttention(nn.Module):
    def __init__(
        self, args: OPTArgs, backend: AttentionBackend, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__()
        head_dim = args.hidden_size // args.num_heads
        heads = args.num_heads
        self.qkv_proj = QKVLinear(
            args.hidden_size, head_dim, heads, heads, bias=args.bias,
            quant_config=quant_config, prefix=f"{prefix}.qkv_proj",
        )
        self.out_proj = RowParallelLinear(
            args.hidden_size, args.hidden_size, bias=args.bias,
            quant_config=quant_config, prefix=f"{prefix}.out_proj",
        )
        heads = self.qkv_proj.num_heads_per_rank  # this rank's share (all at tp = 1)
        self.attn = Attention(heads, head_dim, head_dim**-0.5, heads, backend)

    def forward(self, hidden: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))  # [tokens, hidden] each
        return self.out_proj(self.attn(q, k, v, attn_metadata))  # [tokens, hidden]


class OPTDecoderLayer(nn.Module):
    def __init__(
        self, args: OPTArgs, backend: AttentionBackend, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.pre_norm = args.do_layer_norm_before
        self.self_attn = OPTAttention(args, backend, quant_config, f"{prefix}.self_attn")
        self.self_attn_layer_norm = LayerNorm(args.hidden_size, affine=args.norm_affine)
        self.fc1 = ColumnParallelLinear(
            args.hidden_size, args.ffn_dim, bias=args.bias,
            quant_config=quant_config, prefix=f"{prefix}.fc1",
        )
        self.fc2 = RowParallelLinear(
            args.ffn_dim, args.hidden_size, bias=args.bias,
            quant_config=quant_config, prefix=f"{prefix}.fc2",
        )
        self.activation_fn = Activation(args.activation)
        self.final_layer_norm = LayerNorm(args.hidden_size, affine=args.norm_affine)

    def forward(self, hidden: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        attend = lambda x: self.self_attn(x, attn_metadata)  # noqa: E731
        hidden = self._block(hidden, self.self_attn_layer_norm, attend)
        return self._block(hidden, self.final_layer_norm, self._mlp)

    def _block(self, hidden: torch.Tensor, norm: LayerNorm, body) -> torch.Tensor:
        """x + body(norm(x)) before-style, or norm(x + body(x)) after-style."""
        if self.pre_norm:
            return hidden + body(norm(hidden))
        return norm(hidden + body(hidden))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(x)))  # [tokens, hidden]


class OPTDecoder(nn.Module):
    def __init__(
        self, args: OPTArgs, backend: AttentionBackend, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__()
        projected = args.word_embed_proj_dim != args.hidden_size
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.word_embed_proj_dim)
        # Learned positions: every rank needs every row, so the table is replicated.
        self.embed_positions = VocabEmbedding(
            args.max_position + POSITION_OFFSET, args.hidden_size, parallel=False
        )
        # The projections stay unquantized and replicated (vLLM keeps them so too): tiny, and
        # quantization tools leave them out.
        self.project_in = Linear(args.word_embed_proj_dim, args.hidden_size) if projected else None
        self.project_out = Linear(args.hidden_size, args.word_embed_proj_dim) if projected else None
        self.layers = nn.ModuleList(
            OPTDecoderLayer(args, backend, quant_config, f"{prefix}.layers.{i}")
            for i in range(args.num_layers)
        )
        self.final_layer_norm = (
            LayerNorm(args.hidden_size, affine=args.norm_affine) if args.final_layer_norm else None
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)  # [tokens, word_embed_proj_dim]
        if self.project_in is not None:
            embeds = self.project_in(embeds)  # [tokens, hidden]
        hidden = embeds + self.embed_positions(positions + POSITION_OFFSET)
        for layer in self.layers:
            hidden = layer(hidden, attn_metadata)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)  # [tokens, word_embed_proj_dim]
        return hidden


class OPTModel(nn.Module):
    """Only a namespace, so parameter names match the checkpoint's model.decoder.*."""

    def __init__(
        self, args: OPTArgs, backend: AttentionBackend, quant_config: QuantizationConfig | None
    ) -> None:
        super().__init__()
        self.decoder = OPTDecoder(args, backend, quant_config, "model.decoder")


class OPTForCausalLM(CausalLM):
    def __init__(
        self,
        hf_config: dict[str, Any],
        attn_backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
    ) -> None:
        super().__init__()
        self.args = OPTArgs.from_hf(hf_config)
        self.model = OPTModel(self.args, attn_backend, quant_config)
        self.lm_head = LMHead(self.args.vocab_size, self.args.word_embed_proj_dim)
        if self.args.tie_word_embeddings:
            self.lm_head.tie_to(self.model.decoder.embed_tokens)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        # Returns [tokens, word_embed_proj_dim], the width the LM head reads.
        return self.model.decoder(input_ids, positions, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        return self.lm_head(hidden_states, widen)  # [n, vocab] float32, or the model dtype

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_params(self, _with_model_prefix(weights), QKV_STACKED)


def _with_model_prefix(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterable[tuple[str, torch.Tensor]]:
    """Original facebook/opt-* files name tensors decoder.*; transformers saves model.decoder.*."""
    for name, tensor in weights:
        yield ("model." + name if name.startswith("decoder.") else name), tensor
