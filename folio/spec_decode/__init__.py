"""Speculative decoding: proposers that draft tokens, and the exact verification of drafts."""
