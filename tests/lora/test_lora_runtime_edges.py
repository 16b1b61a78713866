"""Runtime adapter loading at its edges: concurrent loads of one name, a failed load, unloading
an adapter that is still in use, and --lora-modules' base_model_name as the adapter's parent."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from folio.entrypoints.openai.cli_args import LoRAModulePath, ServerConfig
from folio.entrypoints.openai.errors import BadRequestError
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from tests.helpers.adapters import make_peft_adapter
from tests.helpers.logs import log_records
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer
from tests.server.harness import HANG_LIMIT_S, HeldEngine, ServerThread, make_engine


class SlowEngine:
    """add_lora waits until released: every load is in flight at once."""

    def __init__(self, fail_paths: tuple[str, ...] = ()) -> None:
        self.release = asyncio.Event()
        self.fail_paths = fail_paths
        self.loaded: list[int] = []

    async def add_lora(self, request) -> None:
        await self.release.wait()
        if request.lora_path in self.fail_paths:
            raise ValueError(f"LoRA adapter folder {request.lora_path!r} does not exist.")
        self.loaded.append(request.lora_int_id)

    async def remove_lora(self, lora_int_id: int) -> None:
        raise ValueError(f"Adapter id {lora_int_id} is in use by unfinished requests.")


async def _load_together(models: OpenAIServingModels, engine: SlowEngine, loads: list[tuple[str, str]]) -> list:
    tasks = [asyncio.ensure_future(models.load(engine, name, path)) for name, path in loads]
    await asyncio.sleep(0.01)  # every load has checked the name and awaits the engine
    engine.release.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_concurrent_loads_of_one_name_load_it_once():
    async def main():
        models, engine = OpenAIServingModels("base", "/base", 256, lora_enabled=True), SlowEngine()
        results = await _load_together(models, engine, [("a", "/a")] * 5)
        sequential = None
        try:
            await models.load(engine, "a", "/a")
        except BadRequestError as e:
            sequential = e.message
        return models, engine, results, sequential

    models, engine, results, sequential = asyncio.run(main())
    refused = [r for r in results if isinstance(r, BadRequestError)]
    assert len(refused) == 4 and len(engine.loaded) == 1, results  # all five loaded before the fix
    assert sequential is not None and {r.message for r in refused} == {sequential}
    assert list(models.adapters) == ["a"] and models.adapters["a"][0].lora_int_id == engine.loaded[0]
    assert models._locks == {}  # nothing left behind per name


def test_a_failed_load_does_not_keep_the_name():
    async def main():
        models, engine = OpenAIServingModels("base", "/base", 256, lora_enabled=True), SlowEngine(("/missing",))
        results = await _load_together(models, engine, [("a", "/missing"), ("a", "/a")])
        return models, results

    models, results = asyncio.run(main())
    assert isinstance(results[0], BadRequestError) and "does not exist" in results[0].message
    assert results[1].lora_name == "a" and models.adapters["a"][0].lora_path == "/a"


def test_an_adapter_in_use_is_named_by_its_name():
    async def main():
        models, engine = OpenAIServingModels("base", "/base", 256, lora_enabled=True), SlowEngine()
        engine.release.set()
        await models.load(engine, "mine", "/a")
        with pytest.raises(BadRequestError) as info:
            await models.unload(engine, "mine")
        return info.value

    error = asyncio.run(main())
    assert error.message == "The LoRA adapter 'mine' is in use by unfinished requests." and error.param == "lora_name"


# ---- a real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-edges")
    base = make_tiny_checkpoint("llama", root / "base")
    save_test_tokenizer(base)
    return base, make_peft_adapter(base, root / "small", seed=1, r=4, lora_alpha=8)


@pytest.fixture
def folio_warnings():
    with log_records(logging.WARNING) as records:
        yield records


@pytest.mark.slow
def test_unloading_an_adapter_in_use_says_its_name_and_base_model_name_is_its_parent(case, folio_warnings):
    base, small = case
    config = ServerConfig(lora_modules=(LoRAModulePath("small", small, "org/other-base"),),
                          allow_runtime_lora_updating=True)
    engine = make_engine(base, enable_lora=True, max_loras=1, max_lora_rank=8)
    with ServerThread(engine, config) as server:
        cards = {m["id"]: m for m in httpx.get(f"{server.base_url}/models").json()["data"]}
        assert cards["small"]["parent"] == "org/other-base"  # vLLM's meaning; dropped before the fix
        assert any("base_model_name 'org/other-base'" in r.getMessage() for r in folio_warnings)
        body = {"model": "small", "prompt": "Hello", "max_tokens": 240, "ignore_eos": True}
        post = functools.partial(httpx.post, timeout=HANG_LIMIT_S)
        with HeldEngine(server.engine.engine) as held, ThreadPoolExecutor(2) as pool:
            running = pool.submit(post, f"{server.base_url}/completions", json=body)
            assert held.entered.wait(HANG_LIMIT_S)  # added, and about to take its first step
            pending = pool.submit(post, f"{server.base_url}/unload_lora_adapter", json={"lora_name": "small"})
            time.sleep(0.2)  # the unload reaches the engine before the request's 240 steps
            held.release.set()
            answer = pending.result(HANG_LIMIT_S)
            assert running.result(HANG_LIMIT_S).status_code == 200
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert "'small'" in message and "Adapter id" not in message, message  # "Adapter id 1 is in use" before
        assert httpx.post(f"{server.base_url}/unload_lora_adapter", json={"lora_name": "small"}).status_code == 200
