"""Tokenizer building and loading: deterministic demo vocab, saved like a hub checkpoint, eos ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from folio.demo.tokenizer import build_tokenizer, save_tokenizer
from folio.transformers_utils.tokenizer import eos_token_ids, get_tokenizer
from tests.helpers.tokenizers import save_test_tokenizer, test_tokenizer


def test_demo_tokenizer_fits_a_vocab_1000_checkpoint():
    tok = test_tokenizer()
    assert len(tok) == 1000
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and len(set(ids)) == len(ids)
    text = "Hello, my name is Anna. 東京 🙂 Zürich\n"
    assert tok.decode(tok.encode(text)) == text  # byte-level: every text round-trips


def test_smaller_vocab_and_too_small_vocab():
    assert len(build_tokenizer(400)) == 400
    with pytest.raises(ValueError, match="at least 259"):
        build_tokenizer(100)


def test_build_is_deterministic_across_processes(tmp_path):
    # Rust hash maps are seeded per process: a tie broken by iteration order would show here.
    code = (
        "import sys; from folio.demo.tokenizer import build_tokenizer;"
        "sys.stdout.write(build_tokenizer(1000).backend_tokenizer.to_str())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(other) == json.loads(build_tokenizer(1000).backend_tokenizer.to_str())


def test_saved_folder_loads_like_a_checkpoint(tmp_path):
    save_test_tokenizer(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    tok = get_tokenizer(str(tmp_path))
    assert tok.is_fast and len(tok) == 1000 and tok.eos_token == "<|endoftext|>"
    assert tok.chat_template == test_tokenizer().chat_template
    text = "The capital of France is Paris."
    assert tok.encode(text) == test_tokenizer().encode(text)


def test_folder_without_tokenizer_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="No tokenizer found"):
        get_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="tokenizer_mode"):
        get_tokenizer(str(tmp_path), tokenizer_mode="mistral")


def test_save_tokenizer_writes_template_file(tmp_path):
    save_tokenizer(build_tokenizer(400), str(tmp_path))
    assert (tmp_path / "chat_template.jinja").read_text().startswith("{%- for message in messages %}")


@pytest.mark.parametrize(
    ("config", "expected"),
    [({}, {0}), ({"eos_token_id": 2}, {0, 2}), ({"eos_token_id": [0, 2, 1]}, {0, 1, 2}), ({"eos_token_id": None}, {0})],
)
def test_eos_ids_merge_tokenizer_and_generation_config(config, expected):
    assert eos_token_ids(test_tokenizer(), config) == expected
