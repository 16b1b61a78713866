"""Bodies of POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's fields)."""

from __future__ import annotations

from pydantic import Field

from folio.entrypoints.openai.protocol.common import OpenAIBaseModel


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False  # replace an adapter already loaded under this name


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # accepted as vLLM does; the name decides
