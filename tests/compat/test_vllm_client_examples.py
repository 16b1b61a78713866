"""vLLM's documented OpenAI client examples, run against folio's server with only the address changed.

Each EXAMPLE follows the code of vLLM's examples (online_serving/openai_{completion,
chat_completion,embedding}_client.py), trimmed to their API calls. Run here through
tests/helpers/vllm_examples.py against a test server over the tiny test checkpoint on the CPU;
the test checks what each printed or built. The offline examples are in
test_vllm_offline_examples.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.vllm_examples import run_example
from tests.server.harness import ServerThread, make_engine

COMPLETION_CLIENT = '''
from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"


def main():
    client = OpenAI(
        # defaults to os.environ.get("OPENAI_API_KEY")
        api_key=openai_api_key,
        base_url=openai_api_base,
    )

    models = client.models.list()
    model = models.data[0].id

    # Completion API
    stream = False
    completion = client.completions.create(
        model=model,
        prompt="A robot may not injure a human being",
        echo=False,
        n=2,
        stream=stream,
        logprobs=3,
    )

    print("-" * 50)
    print("Completion results:")
    if stream:
        for c in completion:
            print(c)
    else:
        print(completion)
    print("-" * 50)
    return completion


completion = main()
'''

CHAT_CLIENT = '''
from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"

messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]


def main(stream):
    client = OpenAI(
        # defaults to os.environ.get("OPENAI_API_KEY")
        api_key=openai_api_key,
        base_url=openai_api_base,
    )

    models = client.models.list()
    model = models.data[0].id

    chat_completion = client.chat.completions.create(
        messages=messages,
        model=model,
        stream=stream,
        max_completion_tokens=16,
    )

    print("-" * 50)
    print("Chat completion results:")
    if stream:
        for c in chat_completion:
            print(c.choices[0].delta.content or "", end="")
        print()
    else:
        print(chat_completion)
    print("-" * 50)
    return chat_completion


chat_completion = main(stream=False)
streamed = main(stream=True)
'''

EMBEDDING_CLIENT = '''
from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"


def main():
    client = OpenAI(
        # defaults to os.environ.get("OPENAI_API_KEY")
        api_key=openai_api_key,
        base_url=openai_api_base,
    )

    models = client.models.list()
    model = models.data[0].id

    responses = client.embeddings.create(
        # ruff: noqa: E501
        input=[
            "Hello my name is",
            "The best thing about vLLM is that it supports many different models",
        ],
        model=model,
    )

    for data in responses.data:
        print(data.embedding)  # List of float of len 4096
    return responses


responses = main()
'''


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerThread(make_engine(tiny_model)) as running:
        yield running


def test_openai_completion_client(server, tiny_model):
    scope, _ = run_example(COMPLETION_CLIENT, tiny_model, server.base_url)
    completion = scope["completion"]
    assert len(completion.choices) == 2
    assert all(len(c.logprobs.top_logprobs[0]) >= 3 for c in completion.choices)


def test_openai_chat_client_plain_and_streaming(server, tiny_model):
    scope, printed = run_example(CHAT_CLIENT, tiny_model, server.base_url)
    assert scope["chat_completion"].choices[0].message.role == "assistant"
    assert printed.count("Chat completion results:") == 2


def test_openai_embedding_client(server, tiny_model):
    scope, _ = run_example(EMBEDDING_CLIENT, tiny_model, server.base_url)
    assert len(scope["responses"].data) == 2
