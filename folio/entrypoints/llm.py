"""LLM: the offline API, with vLLM's names, arguments and output objects."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from folio.engine.arg_utils import EngineArgs
from folio.engine.beam_search import BeamSearchOutput, BeamSearchParams, to_beam_search_output
from folio.engine.input_processor import PromptType
from folio.engine.llm_engine import LLMEngine
from folio.engine.startup_heap import frozen_heap_while_running
from folio.entrypoints.llm_pooling import (
    PooledPrompt,
    check_no_adapter,
    check_pooling_task,
    check_score_texts,
    cosine,
    score_pairs,
)
from folio.lora.request import LoRARequest
from folio.outputs import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from folio.param_checks import check_bool
from folio.pooling_params import PoolerConfig, PoolingParams
from folio.sampling_params import RequestOutputKind, SamplingParams
from folio.transformers_utils.chat_template import check_template_kwargs, render_chat, resolve_chat_template

ChatMessages = list[dict[str, Any]]


class LLM:
    """Generate text offline, batching every prompt through the engine at once.

        llm = LLM(model="path/to/checkpoint")   # or LLM() for the built-in demo model
        outputs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    """

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        block_size: int = 16,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks_override: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        enforce_eager: bool = False,
        device: str = "auto",
        load_format: str = "auto",
        **kwargs: Any,
    ) -> None:
        args = EngineArgs.from_kwargs(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            num_gpu_blocks_override=num_gpu_blocks_override,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enforce_eager=enforce_eager,
            device=device,
            load_format=load_format,
            **kwargs,
        )
        self.llm_engine = LLMEngine.from_engine_args(args)
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm_engine.default_sampling_params()

    # ---- generate ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. lora_request: one adapter for every
        prompt, or a list with one entry (or None: the base model) per prompt."""
        prompt_list = _as_prompt_list(prompts)
        params_list = self._params_per_prompt(sampling_params, len(prompt_list))
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompt_list)} prompts.")
        loras = _lora_per_prompt(lora_request, len(prompt_list))
        request_ids = self._add_requests(prompt_list, params_list, priority, loras)
        return self._run_engine(request_ids, use_tqdm)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[BeamSearchOutput]:
        """Beam search over each prompt (vLLM's signature): beam_width sequences per prompt,
        best first, each with the prompt's tokens included. The beams share K/V blocks by
        reference count; engine/beam_search.py gives the algorithm (transformers')."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}.")
        prompt_list = _as_prompt_list(prompts)
        loras = _lora_per_prompt(lora_request, len(prompt_list))
        request_ids = self._add_requests(prompt_list, [params] * len(prompt_list), None, loras)
        return [to_beam_search_output(o) for o in self._run_engine(request_ids, use_tqdm)]

    def chat(
        self,
        messages: ChatMessages | Sequence[ChatMessages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the checkpoint's chat template, then generate."""
        check_bool("add_generation_prompt", add_generation_prompt)  # "no" would read as True
        check_bool("continue_final_message", continue_final_message)
        conversations = _as_conversation_list(messages)
        template_kwargs = check_template_kwargs(chat_template_kwargs)
        tokenizer = self.get_tokenizer()
        template = resolve_chat_template(self.llm_engine.config.model.tokenizer, tokenizer, chat_template)
        prompts = []
        for conversation in conversations:
            text = render_chat(
                template,
                conversation,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                tools=tools,
                bos_token=getattr(tokenizer, "bos_token", None),
                eos_token=getattr(tokenizer, "eos_token", None),
                **template_kwargs,
            )
            ids = tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        truncate_prompt_tokens: int | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (vLLM's LLM.embed): the model's final hidden states pooled
        as pooler_config says (last token by default, or mean), L2-normalized unless asked not."""
        prompt_list = _as_prompt_list(prompts)
        configs = self._pooler_configs(pooling_params, len(prompt_list))
        return [EmbeddingRequestOutput(self._next_id(), EmbeddingOutput(p.vector), p.token_ids, True, p.text)
                for p in self._pool(prompt_list, configs, truncate_prompt_tokens)]

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        pooling_task: str | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode for pooling_task "embed" (the only one folio's pooler makes; None is
        "embed"): per prompt, `outputs.data` is embed()'s vector as a float32 tensor [hidden]. An
        adapter is refused: pooling runs the base model."""
        check_pooling_task(pooling_task)
        check_no_adapter(lora_request, "encode")
        prompt_list = _as_prompt_list(prompts)
        configs = self._pooler_configs(pooling_params, len(prompt_list))
        return [PoolingRequestOutput(self._next_id(), PoolingOutput(torch.tensor(p.vector, dtype=torch.float32)),
                                     p.token_ids, True, p.text)
                for p in self._pool(prompt_list, configs, truncate_prompt_tokens)]

    def score(
        self,
        data_1: PromptType | Sequence[PromptType],
        data_2: PromptType | Sequence[PromptType],
        /,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score for an embedding model: the cosine similarity of each pair's
        embeddings, one output per pair in order. Pairs are 1 to 1, 1 to N (data_1 one prompt)
        or N to N; each distinct prompt is embedded once. The same numbers as /v1/score gives for
        the same texts (engine-default pooling, normalized); pooling_params may pick the pooling
        type. Token prompts are pooled as given (vLLM decodes and re-tokenizes them)."""
        firsts, seconds = _as_prompt_list(data_1), _as_prompt_list(data_2)
        pairs = score_pairs(len(firsts), len(seconds))
        if pooling_params is not None and not isinstance(pooling_params, PoolingParams):
            raise ValueError(f"pooling_params must be PoolingParams or None, got {type(pooling_params).__name__}.")
        check_no_adapter(lora_request, "score")
        check_score_texts(firsts, "data_1")
        check_score_texts(seconds, "data_2")
        default = self.llm_engine.config.model.pooler_config
        config = PoolerConfig((pooling_params or PoolingParams()).resolve(default).pooling_type, normalize=True)
        prompts = firsts + seconds
        pooled = self._pool(prompts, [config] * len(prompts), truncate_prompt_tokens)
        pad = getattr(self.get_tokenizer(), "pad_token_id", None)
        outputs = []
        for i, j in pairs:
            a, b = pooled[i], pooled[len(firsts) + j]
            ids = a.token_ids + ([pad] if pad is not None else []) + b.token_ids  # vLLM's join
            outputs.append(ScoringRequestOutput(self._next_id(), ScoringOutput(cosine(a.vector, b.vector)), ids))
        return outputs

    # ---- internals --------------------------------------------------------------------------
    def _next_id(self) -> str:
        return str(next(self._request_counter))

    def _pooler_configs(self, pooling_params: Any, num_prompts: int) -> list[PoolerConfig]:
        default = self.llm_engine.config.model.pooler_config
        return [p.resolve(default) for p in _pooling_per_prompt(pooling_params, num_prompts)]

    def _pool(self, prompts: list[PromptType], configs: list[PoolerConfig],
              truncate_prompt_tokens: int | None) -> list[PooledPrompt]:
        """Each prompt tokenized, truncated and pooled as its config says: one engine call per
        configuration, each distinct token prompt embedded once (LLMEngine.embed checks them)."""
        truncation = SamplingParams(truncate_prompt_tokens=truncate_prompt_tokens)  # its checks, its rule
        engine = self.llm_engine
        max_len = engine.config.model.max_model_len
        processed = [engine.input_processor.process_prompt(p) for p in prompts]
        token_ids = [truncation.truncated_prompt(p.token_ids, max_len) for p in processed]
        keys = [(config, tuple(ids)) for config, ids in zip(configs, token_ids)]
        vectors: dict[tuple[PoolerConfig, tuple[int, ...]], list[float]] = {}
        for config in dict.fromkeys(configs):
            distinct = [ids for c, ids in dict.fromkeys(keys) if c == config]
            for ids, vector in zip(distinct, engine.embed([list(ids) for ids in distinct], config)):
                vectors[(config, ids)] = vector
        # a copy each: outputs of the same prompt must not share one list
        return [PooledPrompt(p.text, ids, list(vectors[key])) for p, ids, key in zip(processed, token_ids, keys)]

    def _params_per_prompt(
        self, sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * num_prompts
        else:
            if not isinstance(sampling_params, Sequence) or isinstance(sampling_params, str):  # e.g. a dict
                raise ValueError(f"sampling_params must be SamplingParams or a list of them, got "
                                 f"{type(sampling_params).__name__}.")
            params = list(sampling_params)
            if len(params) != num_prompts:
                raise ValueError(
                    f"{len(params)} sampling_params for {num_prompts} prompts: pass one, or one per prompt."
                )
        out = []
        for p in params:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params must be SamplingParams, got {type(p).__name__}.")
            p = p.clone()
            p.output_kind = RequestOutputKind.FINAL_ONLY  # offline callers only want the end
            out.append(p)
        return out

    def _checked_prompt(self, prompt: PromptType, params: SamplingParams | BeamSearchParams) -> dict[str, Any]:
        """The prompt checked with its params as add_request checks them before loading an
        adapter, returned as token ids (not tokenized again)."""
        engine = self.llm_engine
        processed = engine.input_processor.process_request(prompt, params)
        if isinstance(params, SamplingParams):
            engine.structured_output.check(params)
        return {"prompt": processed.text, "prompt_token_ids": processed.token_ids, "cache_salt": processed.cache_salt}

    def _add_requests(
        self,
        prompts: list[PromptType],
        params: Sequence[SamplingParams | BeamSearchParams],
        priority: list[int] | None,
        loras: list[LoRARequest | None] | None = None,
    ) -> list[str]:
        """Add all or none: if any prompt is invalid, the ones already added are withdrawn. With
        adapters every prompt is checked first, so a bad one loads no adapter (a load may push
        another out of the CPU cache)."""
        if loras is not None and any(lora is not None for lora in loras):
            prompts = [self._checked_prompt(prompt, p) for prompt, p in zip(prompts, params)]
        added: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(request_id, prompt, p, priority=priority[i] if priority else 0,
                                            lora_request=loras[i] if loras else None)
                added.append(request_id)
        except BaseException:
            self.llm_engine.abort_request(added)
            raise
        return added

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        wanted = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        start, prompt_tokens, output_tokens = time.perf_counter(), 0, 0
        try:
            with frozen_heap_while_running():  # no full scans of the start-up heap mid-run
                while len(finished) < len(wanted) and self.llm_engine.has_unfinished_requests():
                    for output in self.llm_engine.step():
                        if output.finished and output.request_id in wanted:
                            finished[output.request_id] = output
                            prompt_tokens += len(output.prompt_token_ids)
                            output_tokens += sum(len(c.token_ids) for c in output.outputs)
                            bar.update(1)
                            elapsed = max(time.perf_counter() - start, 1e-9)
                            bar.set_postfix_str(
                                f"input {prompt_tokens / elapsed:.0f} tok/s, output {output_tokens / elapsed:.0f} tok/s",
                                refresh=False,
                            )
        except BaseException:
            self.llm_engine.abort_request([r for r in request_ids if r not in finished])
            raise
        finally:
            bar.close()
        return [finished[r] for r in request_ids]


def _pooling_per_prompt(pooling_params: Any, num_prompts: int) -> list[PoolingParams]:
    if pooling_params is None or isinstance(pooling_params, PoolingParams):
        return [pooling_params or PoolingParams()] * num_prompts
    if not isinstance(pooling_params, Sequence) or isinstance(pooling_params, str):
        raise ValueError(f"pooling_params must be PoolingParams or a list of them, got "
                         f"{type(pooling_params).__name__}.")
    params = list(pooling_params)
    if len(params) != num_prompts:
        raise ValueError(f"{len(params)} pooling_params for {num_prompts} prompts.")
    for p in params:  # None is no default here: vLLM's list takes PoolingParams only
        if not isinstance(p, PoolingParams):
            raise ValueError(f"pooling_params entries must be PoolingParams, got {type(p).__name__}.")
    return params


def _lora_per_prompt(lora_request: Any, num_prompts: int) -> list[LoRARequest | None] | None:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return None if lora_request is None else [lora_request] * num_prompts
    # A str is a Sequence too: "adapter" would read as 7 entries.
    if not isinstance(lora_request, Sequence) or isinstance(lora_request, (str, bytes)):
        raise ValueError(f"lora_request must be a LoRARequest or a list of them, got {type(lora_request).__name__}.")
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(f"lora_request has {len(loras)} entries for {num_prompts} prompts: pass one, or one per prompt.")
    for lora in loras:
        if lora is not None and not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request entries must be LoRARequest or None, got {type(lora).__name__}.")
    return loras


def _as_prompt_list(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        if prompts and all(isinstance(p, int) for p in prompts):
            raise ValueError("Pass token prompts as {'prompt_token_ids': [...]}, not a bare list of ints.")
        return list(prompts)
    raise ValueError(f"prompts must be a string, a prompt dict or a list of them, got {type(prompts).__name__}.")


def _as_conversation_list(messages: Any) -> list[ChatMessages]:
    if isinstance(messages, Sequence) and messages and all(isinstance(m, dict) for m in messages):
        return [list(messages)]
    if isinstance(messages, Sequence) and messages and all(isinstance(m, (list, tuple)) for m in messages):
        empty = [i for i, m in enumerate(messages) if not m]
        if empty:  # it would render to a bare generation prompt
            raise ValueError(f"Conversation {empty[0]} of {len(messages)} is empty: each needs at least one message.")
        return [list(m) for m in messages]
    raise ValueError("messages must be a list of {'role', 'content'} dicts, or a list of such lists.")
