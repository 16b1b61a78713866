"""A synthetic byte-level BPE tokenizer of any vocabulary size, for structured-output benchmarks
of checkpoints that ship no tokenizer (the --load-format dummy configs).

Grammar work scales with the vocabulary (each mask covers every token), so the benchmark needs a
tokenizer as large as the model's. Tokens are built by BPE merges of random pairs of existing
tokens, mostly letters, digits and punctuation, up to 12 bytes: the sizes and byte mix of a real
vocabulary, made locally and deterministically in seconds.
"""

from __future__ import annotations

import random

EOS = "<|endoftext|>"
MAX_TOKEN_CHARS = 12


def build_bench_tokenizer(vocab_size: int, seed: int = 0):  # -> PreTrainedTokenizerFast
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte characters
    common = [c for c in alphabet if c.isalnum() or c in "Ġ{}[]\":,.-_'"]
    vocab = {c: i for i, c in enumerate(alphabet)}
    tokens = list(alphabet)
    merges: list[tuple[str, str]] = []
    rng = random.Random(seed)
    target = vocab_size - 1  # one id left for EOS
    while len(vocab) < target:
        a = rng.choice(common) if rng.random() < 0.5 else rng.choice(tokens)
        b = rng.choice(common) if rng.random() < 0.7 else rng.choice(tokens)
        merged = a + b
        if len(merged) > MAX_TOKEN_CHARS or merged in vocab:
            continue
        vocab[merged] = len(vocab)
        tokens.append(merged)
        merges.append((a, b))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=EOS)
