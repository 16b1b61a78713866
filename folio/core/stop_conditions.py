"""Stop conditions the scheduler applies to a request's tokens: stop tokens, a completed
grammar, max_tokens and max_model_len (stop strings need text: engine/stop_checker.py checks them)."""

from __future__ import annotations

from folio.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> RequestStatus | None:
    """Whether the request's last output token ends it, and why (sets request.stop_reason).

    Order matters: a stop token wins over a length cap reached by the same token. Stop tokens
    count only from min_tokens outputs on (the sampler also masks them before that).
    """
    params = request.sampling_params
    last = request.output_token_ids[-1]
    if last in params.all_stop_token_ids and request.num_output_tokens >= params.min_tokens:
        # stop_reason names an explicit stop token; EOS is reported as None, like vLLM.
        request.stop_reason = last if last in params.stop_token_ids else None
        return RequestStatus.FINISHED_STOPPED
    if request.grammar is not None and request.grammar.is_terminated():
        return RequestStatus.FINISHED_STOPPED  # structured output complete: nothing may follow
    if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


def reaches_length_cap(request: Request, max_model_len: int) -> bool:
    """Whether the request's tokens, placeholders included, reach max_tokens or max_model_len:
    once the placeholders are known, check_stop ends it, so no step goes past them."""
    n = request.num_output_placeholders
    max_tokens = request.sampling_params.max_tokens
    if max_tokens is not None and request.num_output_tokens + n >= max_tokens:
        return True
    return request.num_tokens + n >= max_model_len

