"""LoRA engine arguments given without enable_lora are said to be unused, not dropped silently."""

from __future__ import annotations

import logging

from folio.engine.arg_utils import EngineArgs
from tests.helpers.checkpoints import make_tiny_checkpoint


def test_lora_arguments_without_enable_lora_warn(tmp_path, caplog):
    model = make_tiny_checkpoint("llama", tmp_path / "base")
    with caplog.at_level(logging.WARNING):
        assert EngineArgs(model=model, device="cpu", max_loras=4, max_cpu_loras=8).create_engine_config().lora is None
    assert "max_loras" in caplog.text and "max_cpu_loras" in caplog.text and "enable_lora" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        EngineArgs(model=model, device="cpu").create_engine_config()
    assert "enable_lora" not in caplog.text
