"""Attention backends. `torch` is the plain reference (the CPU path); `triton` is the GPU path."""

from __future__ import annotations

from folio.attention.backends.base import AttentionBackend


def get_attention_backend(name: str, device: str) -> AttentionBackend:
    """Pick a backend by name; 'auto' is triton on CUDA and torch elsewhere."""
    if name == "auto":
        name = "triton" if device == "cuda" else "torch"
    if name == "torch":
        from folio.attention.backends.torch_ref import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        if device != "cuda":
            raise ValueError("The triton attention backend needs a CUDA device; use 'torch'.")
        from folio.attention.backends.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"Unknown attention backend {name!r}: choose 'auto', 'torch' or 'triton'.")


__all__ = ["AttentionBackend", "get_attention_backend"]
