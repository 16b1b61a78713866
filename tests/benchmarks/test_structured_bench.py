"""`folio bench throughput --structured json-schema` end to end on a tiny checkpoint without a
tokenizer (a synthetic one is made): both runs, the same token counts, the grammar figures."""

from __future__ import annotations

import json

import pytest

from folio.entrypoints.cli.main import main
from tests.helpers.checkpoints import make_tiny_checkpoint

pytestmark = pytest.mark.slow


def test_structured_run_beside_the_unconstrained_one(tmp_path, capsys):
    model = make_tiny_checkpoint("llama", tmp_path / "llama")  # no tokenizer files
    out = tmp_path / "result.json"
    args = ["bench", "throughput", "--structured", "json-schema", "--model", model, "--workload", "random",
            "--input-len", "16", "--output-len", "12", "--num-prompts", "4", "--max-model-len", "128",
            "--device", "cpu", "--no-progress", "--json", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 0
    data = json.loads(out.read_text())
    structured, free = data["structured"], data["unconstrained"]
    assert structured["num_requests"] == free["num_requests"] == 4
    assert free["output_tokens"] == structured["output_tokens"] > 0 and free["all_lengths_exact"]
    assert data["grammar_host_ms_per_step"] > 0 and data["steps"] > 0 and data["compile_ms_per_schema"] > 0
    assert data["first_compile_ms"] > 0 and data["grammar_backend_build_ms"] > 0
    assert data["mask_device_ms"] is None  # CPU
    captured = capsys.readouterr()
    assert "structured / unconstrained:" in captured.out and "synthetic byte-level BPE" in captured.err
