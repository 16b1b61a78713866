"""`folio chat`: an interactive terminal chat, against a running server or a local model.

    folio chat --url http://localhost:8000 [--api-key KEY]     # a folio (or any OpenAI) server
    folio chat --model path/to/checkpoint                       # load the model here
    folio chat                                                  # the built-in demo model

Replies stream as they are generated. Type /reset to forget the conversation, /exit (or
end the input) to leave. Lines come from stdin, so a conversation can also be piped in.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from typing import Any, Protocol

PROMPT = "> "


def register(subparsers: argparse._SubParsersAction) -> None:
    from folio.engine.arg_utils import EngineArgs

    p = subparsers.add_parser("chat", help="chat in the terminal, with a server or a local model")
    p.add_argument("--url", default=None, help="a running server (http://host:port or .../v1); none: run locally")
    p.add_argument("--api-key", default=None, help="the server's API key (default: $FOLIO_API_KEY)")
    p.add_argument("--model-name", default=None, help="the served model to ask (default: the server's first)")
    p.add_argument("--system", default=None, help="a system message to start the conversation with")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    EngineArgs.add_cli_args(p)
    p.set_defaults(run=run)


class ChatBackend(Protocol):
    def reply(self, messages: list[dict[str, str]]) -> Iterator[str]:
        """The assistant's answer to the conversation, piece by piece as it is generated."""


def run(args: argparse.Namespace) -> int:
    backend = _remote(args) if args.url else _local(args)
    conversation = Conversation(args.system)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print(PROMPT, end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            conversation.reset()
            continue
        if not text.strip():
            continue
        conversation.say(text, backend)


class Conversation:
    def __init__(self, system: str | None) -> None:
        self.system = system
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def say(self, text: str, backend: ChatBackend) -> str:
        """Send one user message, print the reply as it streams, and remember both."""
        self.messages.append({"role": "user", "content": text})
        pieces = []
        try:
            for piece in backend.reply(self.messages):
                pieces.append(piece)
                print(piece, end="", flush=True)
        except ChatError as e:
            print(f"\n[error] {e}", file=sys.stderr, flush=True)
            self.messages.pop()
            return ""
        print(flush=True)
        answer = "".join(pieces)
        self.messages.append({"role": "assistant", "content": answer})
        return answer


class ChatError(RuntimeError):
    """The backend could not answer (the server said so, or is unreachable)."""


# ---- a server -----------------------------------------------------------------------------------


class RemoteChat:
    def __init__(self, url: str, api_key: str | None, model: str | None, max_tokens: int, temperature: float) -> None:
        import httpx

        base = url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(10.0, read=None))
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        response = self._checked(self.client.get(f"{self.base_url}/models"))
        return response.json()["data"][0]["id"]

    def reply(self, messages: list[dict[str, str]]) -> Iterator[str]:
        body = {"model": self.model, "messages": messages, "stream": True,
                "max_tokens": self.max_tokens, "temperature": self.temperature}
        with self.client.stream("POST", f"{self.base_url}/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                self._checked(response)
            for line in response.iter_lines():
                piece = _event_text(line)
                if piece:
                    yield piece

    @staticmethod
    def _checked(response: Any) -> Any:
        if response.status_code == 200:
            return response
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise ChatError(f"{response.status_code}: {message}")


def _event_text(line: str) -> str | None:
    """The content delta in one server-sent event line, if any; raises on an error event."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    event = json.loads(line[len("data: "):])
    if "error" in event:
        raise ChatError(event["error"].get("message", "the server failed"))
    choices = event.get("choices") or []
    return choices[0].get("delta", {}).get("content") if choices else None


def _remote(args: argparse.Namespace) -> RemoteChat:
    import os

    import httpx

    api_key = args.api_key or os.environ.get("FOLIO_API_KEY")
    try:
        return RemoteChat(args.url, api_key, args.model_name, args.max_tokens, args.temperature)
    except (httpx.HTTPError, ChatError) as e:
        raise ValueError(f"cannot reach a server at {args.url}: {e}") from None


# ---- a local model ------------------------------------------------------------------------------


class LocalChat:
    def __init__(self, engine: Any, max_tokens: int, temperature: float, chat_template: str | None = None) -> None:
        from folio.transformers_utils.chat_template import resolve_chat_template

        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        self.template = resolve_chat_template(engine.config.model.tokenizer, self.tokenizer, chat_template)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._ids = itertools.count()

    def reply(self, messages: list[dict[str, str]]) -> Iterator[str]:
        from folio.sampling_params import RequestOutputKind, SamplingParams
        from folio.transformers_utils.chat_template import ChatTemplateError, render_chat

        try:
            text = render_chat(self.template, messages, bos_token=getattr(self.tokenizer, "bos_token", None),
                               eos_token=getattr(self.tokenizer, "eos_token", None))
        except ChatTemplateError as e:
            raise ChatError(str(e)) from None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        room = self.engine.config.model.max_model_len - len(ids)
        if room < 1:
            raise ChatError("The conversation no longer fits the model's context; /reset to start over.")
        params = SamplingParams(max_tokens=min(self.max_tokens, room), temperature=self.temperature,
                                output_kind=RequestOutputKind.DELTA)
        request_id = f"chat-{next(self._ids)}"
        self.engine.add_request(request_id, {"prompt": text, "prompt_token_ids": ids}, params)
        try:
            yield from self._deltas(request_id)
        finally:
            self.engine.abort_request(request_id)  # a no-op once it finished

    def _deltas(self, request_id: str) -> Iterator[str]:
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.request_id != request_id:
                    continue
                for completion in output.outputs:
                    if completion.text:
                        yield completion.text
                if output.finished:
                    return


def _local(args: argparse.Namespace) -> LocalChat:
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    return LocalChat(engine, args.max_tokens, args.temperature)
