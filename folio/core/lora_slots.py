"""The LoRA admission rule: a step never mixes more distinct adapters than there are GPU slots.

Requests keep their adapter while they run, so the rule is kept on admission: a waiting request
whose adapter is not among the running requests' adapters is admitted only while fewer than
max_loras distinct adapters run. A request it holds back keeps its place in the queue and the
requests behind it are considered (as vLLM does), so one busy adapter cannot stall the rest.
Base-model requests (lora_int_id 0) never count.
"""

from __future__ import annotations

from collections.abc import Iterable

from folio.core.request import Request


class LoRASlots:
    """The distinct adapters of the running requests during one admission pass."""

    def __init__(self, max_loras: int | None, running: Iterable[Request]) -> None:
        self.max_loras = max_loras  # None: LoRA off, every request fits
        self.active = {r.lora_int_id for r in running if r.lora_int_id}

    def fits(self, request: Request) -> bool:
        lora_id = request.lora_int_id
        if self.max_loras is None or not lora_id or lora_id in self.active:
            return True
        return len(self.active) < self.max_loras

    def admit(self, request: Request) -> None:
        if request.lora_int_id:
            self.active.add(request.lora_int_id)
