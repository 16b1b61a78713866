"""The demo model: deterministic builds, a real checkpoint layout, built once per cache, race-safe."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from folio.demo import model as demo
from folio.demo.model import DEMO_MODEL_NAME, build_demo_model, demo_cache_root, ensure_demo_model, is_complete
from folio.demo.trainer import TrainingRecipe, training_tokens

LAYOUT = [
    "chat_template.jinja",
    "config.json",
    "folio_demo.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]
# Same code path as the real build, a few steps only: determinism does not depend on the count.
QUICK = TrainingRecipe(steps=4, batch_size=2, seq_len=16)


def _digests(folder: str) -> dict[str, str]:
    return {
        name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(folder))
    }


def test_two_builds_are_byte_identical(tmp_path):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    build_demo_model(str(tmp_path / "a"), recipe=QUICK)
    assert torch.equal(torch.rand(3), before)  # the caller's random state is untouched
    threads = torch.get_num_threads()
    build_demo_model(str(tmp_path / "b"), recipe=QUICK)
    assert torch.get_num_threads() == threads
    a, b = _digests(str(tmp_path / "a")), _digests(str(tmp_path / "b"))
    assert sorted(a) == LAYOUT
    assert a == b


@pytest.mark.slow
def test_demo_model_is_built_once_and_loads_like_any_checkpoint(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from folio.config.model import ModelConfig
    from folio.transformers_utils.chat_template import render_chat, resolve_chat_template

    path = ensure_demo_model(str(tmp_path))
    assert path == str(tmp_path / DEMO_MODEL_NAME) and sorted(os.listdir(path)) == LAYOUT
    assert [p.name for p in tmp_path.iterdir()] == [DEMO_MODEL_NAME]  # no staging folder left
    monkeypatch.setattr(demo, "build_demo_model", _must_not_build)
    assert ensure_demo_model(str(tmp_path)) == path

    config = ModelConfig.create(path)
    assert config.architecture == "LlamaForCausalLM" and config.vocab_size == 1000
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == config.vocab_size
    prompt = render_chat(resolve_chat_template(path, tok, None), [{"role": "user", "content": "Hello!"}])
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    # Trained, not random: on its own corpus (in training-length windows) the loss is far
    # below a random model's ln(1000) = 6.9.
    recipe = TrainingRecipe()
    windows = torch.tensor(training_tokens(tok, recipe)[: 16 * recipe.seq_len]).view(16, recipe.seq_len)
    with torch.no_grad():
        assert model(input_ids=windows, labels=windows).loss.item() < 3.5


def _must_not_build(path: str, *args, **kwargs) -> None:
    raise AssertionError("the demo model was built again")


def test_losing_the_race_keeps_the_winners_folder(tmp_path, monkeypatch):
    final = tmp_path / DEMO_MODEL_NAME

    def build_while_another_process_finishes(path: str, *args, **kwargs) -> None:
        (open(os.path.join(path, "folio_demo.json"), "w")).write("{}")
        final.mkdir()
        (final / "folio_demo.json").write_text('{"winner": true}')

    monkeypatch.setattr(demo, "build_demo_model", build_while_another_process_finishes)
    assert ensure_demo_model(str(tmp_path)) == str(final)
    assert (final / "folio_demo.json").read_text() == '{"winner": true}'
    assert [p.name for p in tmp_path.iterdir()] == [DEMO_MODEL_NAME]  # our staging copy is gone


def test_incomplete_folder_in_the_way_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / DEMO_MODEL_NAME).mkdir()
    (tmp_path / DEMO_MODEL_NAME / "config.json").write_text("{}")
    monkeypatch.setattr(demo, "build_demo_model", lambda path, *a, **k: None)
    with pytest.raises(ValueError, match="not a complete demo model"):
        ensure_demo_model(str(tmp_path))
    assert not is_complete(str(tmp_path / DEMO_MODEL_NAME))


def test_cache_root_from_argument_env_or_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "env"))
    assert demo_cache_root() == str(tmp_path / "env")
    assert demo_cache_root(str(tmp_path / "arg")) == str(tmp_path / "arg")
    monkeypatch.delenv("FOLIO_CACHE_DIR")
    assert demo_cache_root() == os.path.expanduser("~/.cache/folio")
