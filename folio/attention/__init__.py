"""Attention: per-step metadata and the backends that read K/V through block tables."""

from folio.attention.backends import AttentionBackend, get_attention_backend
from folio.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
