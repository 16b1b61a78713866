"""GET /v1/models and /v1/models/{model}: the one model this server serves."""

from __future__ import annotations

import time

from folio.entrypoints.openai.errors import model_not_found
from folio.entrypoints.openai.protocol import ModelCard, ModelList


class OpenAIServingModels:
    def __init__(self, model_name: str, root: str, max_model_len: int) -> None:
        self.card = ModelCard(id=model_name, created=int(time.time()), root=root, max_model_len=max_model_len)

    def list(self) -> ModelList:
        return ModelList(data=[self.card])

    def retrieve(self, model: str) -> ModelCard:
        if model != self.card.id:
            raise model_not_found(model, self.card.id)
        return self.card
