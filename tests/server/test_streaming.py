"""Streaming: chunks in OpenAI's exact shapes, and streamed text equal to the whole response."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


def _events(server, path: str, body: dict) -> list[dict | str]:
    """The raw server-sent events: parsed JSON objects, and the final '[DONE]'."""
    events = []
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_completion_stream_equals_whole(client, model_name):
    for max_tokens in (1, 5, 40):
        whole = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=max_tokens, **GREEDY)
        chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=max_tokens,
                                                stream=True, **GREEDY))
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        assert chunks[-1].choices[0].finish_reason == "length"
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_stream_equals_whole(client, model_name):
    whole = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=30, **GREEDY)
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=30,
                                                 stream=True, **GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"


def test_chat_chunks_have_openai_shape(server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    events = _events(server, "/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None and first["choices"][0]["logprobs"] is None
    for chunk in chunks[1:]:
        assert set(chunk["choices"][0]["delta"]) <= {"content"}  # the role is sent once
        assert chunk["usage"] is None  # with include_usage, null until the last
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert "cached_tokens" in usage["prompt_tokens_details"]
    assert len({c["id"] for c in events[:-1]}) == 1


def test_without_include_usage_no_usage_key(server, model_name):
    events = _events(server, "/completions", {"model": model_name, "prompt": PROMPT, "max_tokens": 3, "stream": True})
    assert events[-1] == "[DONE]"
    assert all("usage" not in e and e["object"] == "text_completion" for e in events[:-1])


def test_n_choices_stream_by_index_and_repeat_with_a_seed(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=10, n=3, temperature=1.0, seed=1234,
                  extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(second.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1
    streamed = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(stream=True, **kwargs):
        (choice,) = chunk.choices
        streamed[choice.index] += choice.text
    assert [streamed[i] for i in range(3)] == texts


def test_n_chat_choices_each_get_a_role_chunk(server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 4, "n": 2, "temperature": 1.0, "seed": 3,
            "stream": True}
    events = _events(server, "/chat/completions", body)[:-1]
    for index in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["finish_reason"] == "length"


def test_batch_of_prompts_with_n_numbers_choices_prompt_by_prompt(client, model_name):
    prompts = ["Hello", "The sky is"]
    r = client.completions.create(model=model_name, prompt=prompts, max_tokens=3, n=2, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    alone = client.completions.create(model=model_name, prompt=prompts[1], max_tokens=3, temperature=0)
    assert [c.text for c in r.choices if c.index in (2, 3)] == [alone.choices[0].text] * 2


def test_echo_prepends_the_prompt(client, model_name):
    whole = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, echo=True, **GREEDY)
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, **GREEDY)
    assert whole.choices[0].text == PROMPT + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=5, echo=True, stream=True, **GREEDY))
    assert streamed == whole.choices[0].text


def test_stop_strings_cut_the_text_streaming_or_not(client, model_name):
    full = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30, **GREEDY).choices[0].text
    stop = full[8:11]
    assert len(stop) == 3
    cut = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30, stop=[stop], **GREEDY).choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    assert cut.model_extra["stop_reason"] == stop
    streamed = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30, stop=stop,
                                              stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    assert streamed[-1].choices[0].finish_reason == "stop"
    kept = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30, stop=[stop], temperature=0,
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == full[: full.index(stop) + len(stop)]


def test_logit_bias_forces_a_token(client, model_name, server):
    token_id = server.engine.tokenizer.encode(" the")[0]
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0,
                                  logit_bias={str(token_id): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == " the" * 4


def test_completion_logprobs_legacy_shape(client, model_name):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    _same_text(lp.tokens, r.choices[0].text)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # Keyed by token text, as OpenAI's legacy shape is: two partial characters that both
        # read U+FFFD share a key, so a row can hold fewer than k entries.
        assert 1 <= len(top) <= 4
        assert top[token] == logprob == max(top.values())  # greedy: the most likely
    echoed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, logprobs=2, echo=True, **GREEDY)
    elp = echoed.choices[0].logprobs
    assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None
    _same_text(elp.tokens, echoed.choices[0].text)
    assert all(v is not None for v in elp.token_logprobs[1:])


def _same_text(tokens: list[str], text: str) -> None:
    """Token texts join into the text, except where a character spans tokens (each reads U+FFFD)."""
    joined = "".join(tokens)
    if "\ufffd" not in joined:
        assert joined == text


def test_completion_logprobs_stream_like_whole(client, model_name):
    whole = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, logprobs=2, **GREEDY)
    tokens, offsets, values = [], [], []
    for chunk in client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, logprobs=2,
                                           stream=True, **GREEDY):
        lp = chunk.choices[0].logprobs
        tokens += lp.tokens
        offsets += lp.text_offset
        values += lp.token_logprobs
    wl = whole.choices[0].logprobs
    assert tokens == wl.tokens and offsets == wl.text_offset
    assert values == pytest.approx(wl.token_logprobs, abs=1e-4)


def test_chat_logprobs_shape(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, logprobs=True,
                                       top_logprobs=3, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", errors="replace") == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
    none = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=2)
    assert none.choices[0].logprobs is None
    streamed = []
    for chunk in client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, logprobs=True,
                                                top_logprobs=3, stream=True, **GREEDY):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in content]


@pytest.mark.parametrize("usage_null", [False, True])
def test_chunk_format_writes_what_the_chunk_models_write(usage_null):
    from folio.entrypoints.openai.protocol import (
        ChatCompletionStreamResponse,
        ChatStreamChoice,
        CompletionChoice,
        CompletionStreamResponse,
        DeltaMessage,
    )
    from folio.entrypoints.openai.streaming import ChunkFormat, sse

    exclude = None if usage_null else {"usage"}
    choice = CompletionChoice(index=3, text='é "quoted"\n', logprobs=None, finish_reason="stop", stop_reason="\n")
    whole = CompletionStreamResponse(id="cmpl-1", created=7, model="m/ü", choices=[choice])
    assert ChunkFormat("cmpl-1", "text_completion", 7, "m/ü", usage_null).event(choice) == sse(whole, exclude=exclude)
    delta = ChatStreamChoice(index=0, delta=DeltaMessage(content="hi"))
    chat = ChatCompletionStreamResponse(id="c", created=7, model="m", choices=[delta])
    expected = sse(chat, exclude={"system_fingerprint"} | (exclude or set()))
    assert ChunkFormat("c", "chat.completion.chunk", 7, "m", usage_null).event(delta) == expected
