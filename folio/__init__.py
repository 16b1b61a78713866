"""folio: a high-throughput LLM inference and serving engine.

    from folio import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint")      # or LLM() for the built-in demo model
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from folio.lora.request import LoRARequest
from folio.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from folio.pooling_params import PoolingParams
from folio.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from folio.version import __version__

if TYPE_CHECKING:
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.llm_engine import LLMEngine
    from folio.entrypoints.llm import LLM

# LLM and the engine pull in torch and transformers; import them only when asked for.
_LAZY = {
    "LLM": "folio.entrypoints.llm",
    "LLMEngine": "folio.engine.llm_engine",
    "EngineArgs": "folio.engine.arg_utils",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'folio' has no attribute {name!r}")


__all__ = [
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "LLMEngine",
    "Logprob",
    "LoRARequest",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "ScoringOutput",
    "ScoringRequestOutput",
    "StructuredOutputsParams",
    "__version__",
]
