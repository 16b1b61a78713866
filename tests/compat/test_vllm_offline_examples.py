"""vLLM's documented offline examples, run against folio with only the import (and the model) changed.

Each EXAMPLE follows the code of vLLM's examples (offline_inference/basic/{basic,generate,chat,
embed}.py, offline_inference/llm_engine_example.py), trimmed to their API calls (argument
parsing of the scripts themselves left out, max tokens small). Run here through
tests/helpers/vllm_examples.py (folio imported in vllm's place, the tiny test checkpoint on the
CPU); the test checks what each printed or built. The OpenAI client examples are in
test_vllm_client_examples.py.
"""

from __future__ import annotations

from tests.helpers.vllm_examples import run_example

BASIC = '''
from vllm import LLM, SamplingParams

# Sample prompts.
prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
# Create a sampling params object.
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    # Create an LLM.
    llm = LLM(model="facebook/opt-125m")
    # Generate texts from the prompts.
    # The output is a list of RequestOutput objects
    # that contain the prompt, generated text, and other information.
    outputs = llm.generate(prompts, sampling_params)
    # Print the outputs.
    print("\\nGenerated Outputs:\\n" + "-" * 60)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt:    {prompt!r}")
        print(f"Output:    {generated_text!r}")
        print("-" * 60)


main()
'''

GENERATE_WITH_ENGINE_ARGS = '''
from vllm import LLM, EngineArgs
from vllm.utils import FlexibleArgumentParser


def create_parser():
    parser = FlexibleArgumentParser()
    # Add engine args
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")
    # Add sampling params
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    return parser


def main(args: dict):
    # Pop arguments not used by LLM
    max_tokens = args.pop("max_tokens")
    temperature = args.pop("temperature")
    top_p = args.pop("top_p")
    top_k = args.pop("top_k")

    # Create an LLM
    llm = LLM(**args)

    # Create a sampling params object
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k

    # Generate texts from the prompts. The output is a list of RequestOutput
    # objects that contain the prompt, generated text, and other information.
    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    outputs = llm.generate(prompts, sampling_params)
    # Print the outputs.
    print("-" * 50)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}\\nGenerated text: {generated_text!r}")
        print("-" * 50)


parser = create_parser()
args: dict = vars(parser.parse_args(["--max-tokens", "8", "--device", "cpu", "--max-model-len", "128"]))
main(args)
'''

LLM_ENGINE = '''
import argparse

from vllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from vllm.utils import FlexibleArgumentParser


def create_test_prompts() -> list[tuple[str, SamplingParams]]:
    """Create a list of test prompts with their sampling parameters."""
    return [
        (
            "A robot may not injure a human being",
            SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1),
        ),
        (
            "To be or not to be,",
            SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2),
        ),
        (
            "What is the meaning of life?",
            SamplingParams(n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.1),
        ),
    ]


def process_requests(engine: LLMEngine, test_prompts: list[tuple[str, SamplingParams]]):
    """Continuously process a list of prompts and handle the outputs."""
    request_id = 0

    print("-" * 50)
    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1

        request_outputs: list[RequestOutput] = engine.step()

        for request_output in request_outputs:
            if request_output.finished:
                print(request_output)
                print("-" * 50)


def initialize_engine(args: argparse.Namespace) -> LLMEngine:
    """Initialize the LLMEngine from the command line arguments."""
    engine_args = EngineArgs.from_cli_args(args)
    return LLMEngine.from_engine_args(engine_args)


def parse_args():
    parser = FlexibleArgumentParser(
        description="Demo on using the LLMEngine class directly"
    )
    parser = EngineArgs.add_cli_args(parser)
    return parser.parse_args(ARGV)


def main(args: argparse.Namespace):
    """Main function that sets up and runs the prompt processing."""
    engine = initialize_engine(args)
    test_prompts = create_test_prompts()
    process_requests(engine, test_prompts)


args = parse_args()
main(args)
'''

CHAT = '''
from vllm import LLM, SamplingParams

llm = LLM(model="meta-llama/Llama-3.2-1B-Instruct")
sampling_params = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, top_k=20)


def print_outputs(outputs):
    print("\\nGenerated Outputs:\\n" + "-" * 80)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}\\n")
        print(f"Generated text: {generated_text!r}")
        print("-" * 80)


print("=" * 80)

# In this script, we demonstrate how to pass input to the chat method:
conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {
        "role": "user",
        "content": "Write an essay about the importance of higher education.",
    },
]
outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
print_outputs(outputs)

# You can run batch inference with llm.chat API
conversations = [conversation for _ in range(10)]

# We turn on tqdm progress bar to verify it's indeed running batch inference
outputs = llm.chat(conversations, sampling_params, use_tqdm=True)
print_outputs(outputs)
'''

EMBED = '''
from vllm import LLM

# Sample prompts.
prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]

# Create an LLM.
# You should pass runner="pooling" for embedding models
llm = LLM(model="intfloat/e5-small", runner="pooling", enforce_eager=True)

# Generate embedding. The output is a list of EmbeddingRequestOutputs.
outputs = llm.embed(prompts)

# Print the outputs.
print("\\nGenerated Outputs:\\n" + "-" * 60)
for prompt, output in zip(prompts, outputs):
    embeds = output.outputs.embedding
    embeds_trimmed = (
        (str(embeds[:16])[:-1] + ", ...]") if len(embeds) > 16 else embeds
    )
    print(f"Prompt: {prompt!r} \\nEmbeddings: {embeds_trimmed} (size={len(embeds)})")
    print("-" * 60)
'''


def test_offline_basic(tiny_model):
    _, printed = run_example(BASIC, tiny_model)
    assert printed.count("Prompt:    ") == 4 and printed.count("Output:    ") == 4


def test_offline_generate_with_engine_args_cli(tiny_model):
    _, printed = run_example(GENERATE_WITH_ENGINE_ARGS, tiny_model)
    assert printed.count("Generated text: ") == 4


def test_llm_engine_example(tiny_model):
    source = LLM_ENGINE.replace("ARGV", repr(["--model", tiny_model, "--device", "cpu", "--max-model-len", "128"]))
    _, printed = run_example(source, tiny_model)
    assert printed.count("RequestOutput(") == 3


def test_offline_chat(tiny_model):
    scope, printed = run_example(CHAT, tiny_model)
    assert printed.count("Generated text: ") == 11
    assert all(o.outputs[0].text is not None for o in scope["outputs"])


def test_offline_embed(tiny_model):
    scope, printed = run_example(EMBED, tiny_model)
    assert printed.count("Embeddings: ") == 4
    assert all(len(o.outputs.embedding) == scope["llm"].llm_engine.config.model.hidden_size for o in scope["outputs"])
