"""Layer contracts the models rely on beyond what the end-to-end logits show."""

from __future__ import annotations

import pytest
import torch

from folio.layers.activation import Activation, gated_activation
from folio.layers.layernorm import RMSNorm
from folio.layers.linear import QKVLinear


def test_rmsnorm_with_residual_returns_the_normalized_sum_and_the_sum():
    torch.manual_seed(0)
    norm = RMSNorm(12, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x, residual = torch.randn(5, 12), torch.randn(5, 12)
    normed, summed = norm(x, residual)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(normed, norm(x + residual))
    s = x + residual
    expected = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(normed, expected)


def test_qkv_shards_land_in_their_rows_and_bad_shapes_are_refused():
    layer = QKVLinear(hidden_size=8, head_dim=3, num_heads=4, num_kv_heads=2, bias=True)
    q, k, v = torch.full((12, 8), 1.0), torch.full((6, 8), 2.0), torch.full((6, 8), 3.0)
    for shard, tensor in zip("qkv", (q, k, v)):
        layer.weight.weight_loader(layer.weight, tensor, shard)
    out = torch.ones(1, 8) @ layer.weight.data.T  # [1, 24]
    got_q, got_k, got_v = layer.split(out)
    assert got_q.shape == (1, 12) and got_k.shape == (1, 6) and got_v.shape == (1, 6)
    assert (got_q == 8).all() and (got_k == 16).all() and (got_v == 24).all()
    with pytest.raises(ValueError, match=r"shard 'k'.*\(4,\).*\(6,\)"):
        layer.bias.weight_loader(layer.bias, torch.zeros(4), "k")


def test_unsupported_activations_are_named():
    with pytest.raises(ValueError, match="quick_gelu"):
        Activation("quick_gelu")
    with pytest.raises(ValueError, match="gelu"):
        gated_activation("gelu")
