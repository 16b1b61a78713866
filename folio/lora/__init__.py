"""Multi-LoRA serving: PEFT adapters on one base model, mixed per token in one batch.

Only the request type is exported here (it is torch-free, so folio/core/ may carry it); the
adapter loader, the GPU slot manager and the layer wrappers are imported from their modules.
"""

from folio.lora.request import LoRARequest

__all__ = ["LoRARequest"]
