"""Tokenizers for tests, built locally (no hub): the demo byte-level BPE, and a sentencepiece-style one.

`test_tokenizer()` is the one the engine tests save next to their tiny checkpoints (vocab 1000,
like those checkpoints). `sentencepiece_tokenizer()` is built differently on purpose, for the
detokenizer tests: Metaspace pre-tokenization ("▁" for spaces), byte-fallback tokens
<0x00>..<0xFF> for characters outside its alphabet, and a decoder that strips the leading
space of the decoded text, as Llama 2 and Mistral tokenizers do.
"""

from __future__ import annotations

import functools
import json

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from folio.demo.corpus import tokenizer_training_text
from folio.demo.tokenizer import CHATML_TEMPLATE, build_tokenizer, save_tokenizer

SP_SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2, as in Llama
SP_ADDED_SPECIAL = "<|im_end|>"  # a special token added after training
SP_ADDED_PLAIN = "<tool_call>"  # an added token that is NOT special: never skipped


@functools.cache
def test_tokenizer() -> PreTrainedTokenizerFast:
    """The demo tokenizer (byte-level BPE, vocab 1000, ChatML). Shared: do not mutate it."""
    return build_tokenizer(1000)


test_tokenizer.__test__ = False  # a helper, not a test, when imported into a test module


def save_test_tokenizer(path: str) -> None:
    """Write the test tokenizer's files (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    save_tokenizer(test_tokenizer(), path)


@functools.cache
def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style BPE: Metaspace, byte fallback, <s>/</s>/<unk>, leading-space strip."""
    trainer_model = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=SP_SPECIALS, limit_alphabet=60, show_progress=False
    )
    trainer_model.train_from_iterator(tokenizer_training_text(), trainer=trainer)
    trained, merges = _vocab_and_merges(trainer_model)
    # Re-number as Llama does: specials, then the 256 byte tokens, then the learned pieces.
    vocab = {tok: i for i, tok in enumerate(SP_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if tok not in vocab:
            vocab[tok] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SP_SPECIALS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [SP_ADDED_SPECIAL]})
    tokenizer.add_tokens([AddedToken(SP_ADDED_PLAIN, special=False, normalized=False)])
    tokenizer.chat_template = CHATML_TEMPLATE.replace("<|im_start|>", "<s>")
    return tokenizer


def _vocab_and_merges(backend: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    model = json.loads(backend.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges
