"""POST /tokenize and /detokenize (vLLM's extras), with the same prompt handling as generation."""

from __future__ import annotations

from folio.engine.detokenizer import decode_token
from folio.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from folio.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            text = self.render_chat(
                request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template_kwargs=request.chat_template_kwargs,
            )
        else:
            text = request.prompt
        param = "messages" if isinstance(request, TokenizeChatRequest) else "prompt"
        # No context limit here: /tokenize reports the count (long texts still leave the event loop).
        tokens = await self.encode_async(text, add_special_tokens=request.add_special_tokens, param=param,
                                         truncating=True)
        token_strs = [decode_token(self.tokenizer, t) for t in tokens] if request.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens, token_strs=token_strs)

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        self.check_token_ids(request.tokens, "tokens")
        return DetokenizeResponse(prompt=self.decode(request.tokens, "tokens"))
