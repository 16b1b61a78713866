"""RequestLogger: one log line per request added to the engine (vLLM's --enable-log-requests),
with the prompt and its token ids cut to --max-log-len."""

from __future__ import annotations

from typing import Any

from folio.logger import init_logger

logger = init_logger("folio.entrypoints.openai.requests")


class RequestLogger:
    def __init__(self, max_log_len: int | None) -> None:
        self.max_log_len = max_log_len

    def log(self, request_id: str, prompt: str | None, token_ids: list[int], params: Any) -> None:
        if self.max_log_len is not None:
            prompt = prompt[: self.max_log_len] if prompt is not None else None
            token_ids = token_ids[: self.max_log_len]
        logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s",
                    request_id, prompt, params, token_ids)
