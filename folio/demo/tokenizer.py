"""The demo tokenizer: a byte-level BPE trained locally on the demo corpus, with ChatML specials.

Deterministic: the same corpus, trainer settings and special tokens give the same vocabulary
and merges on every run. Its full vocabulary (specials included) is exactly `vocab_size`, so a
checkpoint with that vocab_size can use it.
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from folio.demo.corpus import tokenizer_training_text

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2

# ChatML, as Qwen and many others use it. `content` may be None (an assistant turn that only
# calls tools), which renders as empty text.
CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def build_tokenizer(vocab_size: int = 1000) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE; eos and pad are <|endoftext|>, the template is ChatML."""
    min_size = 256 + len(SPECIAL_TOKENS)  # every byte must stay representable
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be at least {min_size}, got {vocab_size}.")
    backend = Tokenizer(models.BPE())
    # GPT-2 style: no prefix space, so encode(a + b) == encode(a) + encode(b) at word starts.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(tokenizer_training_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja, as hub checkpoints have."""
    os.makedirs(path, exist_ok=True)
    tokenizer.save_pretrained(path)
    template = tokenizer.chat_template
    jinja_path = os.path.join(path, "chat_template.jinja")
    if isinstance(template, str) and not os.path.isfile(jinja_path):
        with open(jinja_path, "w", encoding="utf-8") as f:
            f.write(template)
