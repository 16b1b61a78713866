"""Running one of vLLM's documented examples against folio, with only the import (and the model) changed.

The example's source has `from vllm import` -> `from folio import` (vllm.utils'
FlexibleArgumentParser -> argparse's), the model name -> the tiny test checkpoint on the CPU,
the server address -> the test server's (tests/compat/test_vllm_*_examples.py).
"""

from __future__ import annotations

import contextlib
import io
import textwrap


def run_example(source: str, model: str, base_url: str | None = None) -> tuple[dict, str]:
    """Execute the example with folio imported in vllm's place; returns its globals and stdout."""
    code = textwrap.dedent(source)
    code = code.replace("from vllm import", "from folio import")
    code = code.replace("from vllm.utils import FlexibleArgumentParser",
                        "from argparse import ArgumentParser as FlexibleArgumentParser")
    for name in ("facebook/opt-125m", "meta-llama/Llama-3.2-1B-Instruct", "intfloat/e5-small"):
        code = code.replace(f'model="{name}"', f'model="{model}", device="cpu", max_model_len=128')
        code = code.replace(f'parser.set_defaults(model="{model}", device="cpu", max_model_len=128)',
                            f'parser.set_defaults(model="{model}")')
    if base_url is not None:
        code = code.replace('"http://localhost:8000/v1"', f'"{base_url}"')
    scope: dict = {"__name__": "example"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<vllm example>", "exec"), scope)  # noqa: S102 - our own test text
    return scope, out.getvalue()
