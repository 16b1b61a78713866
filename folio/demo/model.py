"""The built-in demo model: made locally and deterministically, saved as an ordinary checkpoint.

`ensure_demo_model()` returns a folder with config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json and chat_template.jinja; the
engine then loads it like any other checkpoint. It is built once per cache folder
($FOLIO_CACHE_DIR or ~/.cache/folio, in a subfolder named by DEMO_MODEL_VERSION): into a
temporary folder next to the final one, renamed into place only when complete. A rename is
atomic, so two processes that build at once both end with one complete folder, never a half one.

The model is a small Llama (0.7 M parameters, the demo tokenizer's 1000-token vocabulary)
trained for 200 steps on the demo corpus, so it writes short English sentences and ChatML
answers instead of random tokens. The build takes about 12 s on one CPU thread (measured on a
busy 2-core development machine: 11-15 s); everything else in it takes well under a second.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from folio.demo.tokenizer import IM_END, build_tokenizer, save_tokenizer
from folio.demo.trainer import TrainingRecipe, fixed_threads, init_seeded, train, training_tokens
from folio.logger import init_logger

logger = init_logger(__name__)

# Bump whenever anything that changes the built files changes (corpus, shapes, recipe): old
# caches are then left alone and a new folder is built.
DEMO_MODEL_VERSION = 1
DEMO_MODEL_NAME = f"folio-demo-v{DEMO_MODEL_VERSION}"
# Written last: a folder holding it is complete.
_BUILD_INFO = "folio_demo.json"


@dataclass(frozen=True)
class DemoModelShape:
    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA, like the models folio serves
    max_position_embeddings: int = 2048


def demo_cache_root(cache_dir: str | None = None) -> str:
    """Where built artefacts live: `cache_dir`, else $FOLIO_CACHE_DIR, else ~/.cache/folio."""
    root = cache_dir or os.environ.get("FOLIO_CACHE_DIR") or os.path.join("~", ".cache", "folio")
    return os.path.abspath(os.path.expanduser(root))


def ensure_demo_model(cache_dir: str | None = None) -> str:
    """The demo model's folder, built first if this cache does not have it yet."""
    root = demo_cache_root(cache_dir)
    final = os.path.join(root, DEMO_MODEL_NAME)
    if is_complete(final):
        logger.debug("Using the demo model at %s", final)
        return final
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{DEMO_MODEL_NAME}.building-", dir=root)
    try:
        logger.info("Building the demo model (first run only) in %s", final)
        build_demo_model(staging)
        _publish(staging, final)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return final


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, _BUILD_INFO))


def build_demo_model(
    path: str,
    shape: DemoModelShape = DemoModelShape(),
    recipe: TrainingRecipe = TrainingRecipe(),
    device: str = "cpu",
) -> None:
    """Write the tokenizer, the trained model and its configs into `path` (which may exist).
    `device` trains elsewhere than the CPU (larger models, e.g. benchmark draft/target pairs)."""
    start = time.perf_counter()
    tokenizer = build_tokenizer(shape.vocab_size)
    eos_ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    config = LlamaConfig(
        **asdict(shape),
        head_dim=shape.hidden_size // shape.num_attention_heads,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    with fixed_threads(recipe.num_threads):
        model = init_seeded(lambda: LlamaForCausalLM(config), recipe.seed).to(device)
        result = train(model, training_tokens(tokenizer, recipe), recipe)
    logger.info(
        "Trained the demo model for %d steps in %.1f s (loss %.2f -> %.2f)",
        recipe.steps, result.seconds, result.first_loss, result.final_loss,
    )
    model.generation_config = _generation_config(eos_ids, tokenizer.pad_token_id)
    with _quiet_progress_bars():
        model.to("cpu").save_pretrained(path)
    save_tokenizer(tokenizer, path)
    info = {"name": DEMO_MODEL_NAME, "shape": asdict(shape), "recipe": asdict(recipe),
            "final_loss": round(result.final_loss, 4)}
    with open(os.path.join(path, _BUILD_INFO), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    logger.info("Demo model built in %.1f s", time.perf_counter() - start)


def _generation_config(eos_ids: list[int], pad_id: int) -> GenerationConfig:
    # A chat turn ends at <|im_end|>, a document at <|endoftext|>. Sampling defaults as chat
    # models ship them: greedy decoding of so small a model soon repeats itself.
    return GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=pad_id, do_sample=True, temperature=0.7, top_p=0.9
    )


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """No "Writing model shards" bar: the log lines above say what is happening."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _publish(staging: str, final: str) -> None:
    """Rename the finished build into place; if another process got there first, keep theirs."""
    try:
        os.rename(staging, final)
    except OSError:
        if not is_complete(final):
            raise ValueError(
                f"{final} exists but is not a complete demo model; remove it and run again."
            ) from None
        logger.info("Another process finished the demo model first; using %s", final)
        return
    logger.info("Demo model ready at %s", final)
