"""Structured outputs after reasoning (structured_output/reasoning.py): with a reasoning parser,
the grammar holds from the token after the model's `</think>`, so a reasoning model thinks first
and then answers in the asked language, as vLLM does; enable_in_reasoning, a prompt that already
closed the thought, or no reasoning parser keep the grammar from the first token."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from tokenizers import AddedToken

from folio import LLM, SamplingParams
from folio.demo.tokenizer import build_tokenizer, save_tokenizer
from folio.sampling_params import StructuredOutputsParams
from folio.structured_output.reasoning import AfterReasoning, reasoning_end_token, reasoning_ended
from tests.helpers.checkpoints import make_tiny_checkpoint

CHOICES = ["yes", "no"]
END, START = 7, 6


class _Inner:
    """A GrammarState stand-in: accepts only token 1, then 2, then is done."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        if token_id != len(self.seen) + 1 or len(self.seen) >= 2:
            return False
        self.seen.append(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 1 << (len(self.seen) + 1)

    def rollback(self, num_tokens: int) -> None:
        del self.seen[len(self.seen) - num_tokens :]

    def reset(self) -> None:
        self.seen.clear()

    def is_terminated(self) -> bool:
        return len(self.seen) == 2


def test_the_grammar_starts_after_the_marker():
    state = AfterReasoning(_Inner(), END)
    mask = torch.zeros(1, 1, dtype=torch.int32)
    for token in (3, 9, 1):  # reasoning: anything goes, even the grammar's own tokens
        state.fill_bitmask(mask, 0)
        assert mask[0, 0] == -1 and state.accept_token(token) and not state.is_terminated()
    assert state.accept_token(END)
    state.fill_bitmask(mask, 0)
    assert mask[0, 0] == 1 << 1  # the grammar's own first token only
    assert not state.accept_token(3) and state.accept_token(1)
    state.rollback(2)  # the grammar's token, then the marker: reasoning again
    assert not state.started and state.inner.seen == []
    assert state.accept_token(END) and state.accept_token(1) and state.accept_token(2) and state.is_terminated()
    state.reset()
    assert not state.started and not state.is_terminated()


@pytest.mark.parametrize("prompt, ended", [
    ([1, 2, 3], False),
    ([1, START, 4], False),  # the prompt opened the thought (Qwen3.5, DeepSeek-R1)
    ([1, START, 4, END, 5], True),  # ... and closed it (Qwen3's enable_thinking=False)
    ([START, 2, END, 9, START, 4], False),  # an earlier turn's thought, a new one opened
])
def test_a_prompt_that_closed_the_thought(prompt, ended):
    assert reasoning_ended(prompt, END, START) is ended


@pytest.fixture(scope="module")
def think_model(tmp_path_factory) -> str:
    """A tiny llama whose tokenizer has <think> and </think> as one (non-special) token each, as
    Qwen3's has."""
    path = str(tmp_path_factory.mktemp("think-llama"))
    make_tiny_checkpoint("llama", path, vocab_size=1024)
    tokenizer = build_tokenizer(1000)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    save_tokenizer(tokenizer, path)
    return path


def _close_thought_at(position: int, end_id: int, eos_id: int):
    """A logits processor that makes the model write </think> as its output token `position`,
    and not end before it. Added, not set: a token the grammar forbids (-inf) stays forbidden."""
    def close(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if len(output_ids) < position:
            logits[eos_id] -= 1e4
        elif len(output_ids) == position:
            logits[end_id] += 1e4
        return logits
    return close


def _generate(llm: LLM, prompt, end_id: int):
    close = _close_thought_at(3, end_id, llm.get_tokenizer().eos_token_id)
    params = SamplingParams(temperature=0, max_tokens=24, logits_processors=[close],
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    return out.outputs[0]


@pytest.mark.slow
def test_the_model_reasons_then_answers_in_the_grammar(think_model):
    llm = LLM(think_model, dtype="float32", device="cpu", max_model_len=128, seed=0,
              structured_outputs_config={"reasoning_parser": "qwen3"})
    tok = llm.get_tokenizer()
    end_id, start_id = reasoning_end_token("qwen3", tok)
    out = _generate(llm, "Think about it:", end_id)
    assert out.token_ids[3] == end_id and out.finish_reason == "stop"
    thought, answer = out.text.split("</think>")
    assert answer in CHOICES and thought == tok.decode(out.token_ids[:3])
    # a prompt that closed the thought already: the grammar from the first token
    closed = _generate(llm, "Think about it:<think></think>", end_id)
    assert closed.text in CHOICES and end_id not in closed.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("config", [{"reasoning_parser": "qwen3", "enable_in_reasoning": True}, {}])
def test_the_grammar_from_the_first_token(think_model, config):
    llm = LLM(think_model, dtype="float32", device="cpu", max_model_len=128, seed=0, structured_outputs_config=config)
    end_id, _ = reasoning_end_token("qwen3", llm.get_tokenizer())
    out = _generate(llm, "Think about it:", end_id)
    assert out.text in CHOICES and end_id not in out.token_ids


@pytest.mark.slow
def test_the_server_gives_the_thought_and_a_valid_reply(think_model):
    """Through `folio serve --reasoning-parser qwen3` and the openai client: </think> forced as the
    first token (logit_bias), then the JSON the response_format asks for, as content."""
    from openai import OpenAI

    from folio.entrypoints.openai.cli_args import ServerConfig
    from tests.server.harness import ServerThread, make_engine
    from tests.server.test_tool_calls_live import _both

    engine = make_engine(think_model, max_model_len=256, structured_outputs_config={"reasoning_parser": "qwen3"})
    end_id, _ = reasoning_end_token("qwen3", engine.tokenizer)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    with ServerThread(engine, ServerConfig(reasoning_parser="qwen3")) as server, \
            OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        message = _both(client, response_format=fmt, logit_bias={str(end_id): 100}, max_tokens=40)
        first = client.chat.completions.create(model=None, messages=[{"role": "user", "content": "hi"}], max_tokens=40,
                                               response_format=fmt, logit_bias={str(end_id): 100}, logprobs=True,
                                               temperature=0)
    assert message["reasoning"] == "" and message["finish"] == "stop", message
    jsonschema.validate(json.loads(message["content"]), schema)
    assert first.choices[0].logprobs.content[0].token == "</think>"


def test_the_servers_reasoning_parser_reaches_the_engine():
    """`folio serve --reasoning-parser` also sets the engine's structured_outputs_config, as
    vLLM's flag does; a config that names its own keeps it."""
    from folio.engine.arg_utils import EngineArgs
    from folio.entrypoints.openai.api_server import make_parser

    def config(*argv: str):
        args = EngineArgs.from_cli_args(make_parser().parse_args(["--device", "cpu", *argv]))
        return args.create_engine_config().structured_outputs

    assert config().reasoning_parser is None
    assert config("--reasoning-parser", "qwen3").reasoning_parser == "qwen3"
    both = config("--reasoning-parser", "qwen3", "--structured-outputs-config", '{"enable_in_reasoning": true}')
    assert (both.reasoning_parser, both.enable_in_reasoning) == ("qwen3", True)
    own = config("--reasoning-parser", "qwen3", "--structured-outputs-config", '{"reasoning_parser": "deepseek_r1"}')
    assert own.reasoning_parser == "deepseek_r1"
