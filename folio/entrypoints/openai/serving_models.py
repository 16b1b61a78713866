"""GET /v1/models and /v1/models/{model}: the served model, and its LoRA adapters by name.

With --enable-lora each adapter is a model of its own in the API (vLLM's behaviour): listed with
the base model as `parent`, and picked by a request's `model` field. Adapters come from
--lora-modules at startup (loaded and checked then: a bad one stops the server) and, with
--allow-runtime-lora-updating, from POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
Each adapter gets a fresh integer id when it is loaded, so an adapter unloaded and loaded again
never shares cached K/V with its earlier self. Loads and unloads of one name run one at a time
(a lock per name): two loads of a name sent together answer as if sent one after the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from folio.entrypoints.openai.errors import BadRequestError, NotFoundError, from_engine_error, model_not_found
from folio.entrypoints.openai.protocol import ModelCard, ModelList
from folio.logger import init_logger
from folio.lora.request import LoRARequest

logger = init_logger(__name__)

if TYPE_CHECKING:
    from folio.engine.async_llm import AsyncLLM
    from folio.entrypoints.openai.cli_args import LoRAModulePath


class OpenAIServingModels:
    def __init__(self, model_name: str, root: str, max_model_len: int, lora_enabled: bool = False) -> None:
        self.card = ModelCard(id=model_name, created=int(time.time()), root=root, max_model_len=max_model_len)
        self.lora_enabled = lora_enabled
        self.adapters: dict[str, tuple[LoRARequest, ModelCard]] = {}
        self._ids = itertools.count(1)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # name -> its lock, and how many hold or wait

    def list(self) -> ModelList:
        return ModelList(data=[self.card, *(card for _, card in self.adapters.values())])

    def retrieve(self, model: str) -> ModelCard:
        if model == self.card.id:
            return self.card
        if model in self.adapters:
            return self.adapters[model][1]
        raise self._not_found(model)

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model (or no name)."""
        if model is None or model == self.card.id:
            return None
        if model in self.adapters:
            return self.adapters[model][0]
        raise self._not_found(model)

    def _not_found(self, model: str) -> NotFoundError:
        if not self.adapters:
            return model_not_found(model, self.card.id)
        names = ", ".join(repr(n) for n in [self.card.id, *self.adapters])
        return NotFoundError(f"The model {model!r} does not exist; this server serves {names}.",
                             param="model", code="model_not_found")

    # ---- loading and unloading ----------------------------------------------------------------
    async def load(self, engine: AsyncLLM, name: str, path: str, inplace: bool = False,
                   parent: str | None = None) -> LoRARequest:
        """Load an adapter into the engine under `name` (400 if unusable or the name is taken;
        inplace: replace the adapter of that name, once the new one has loaded). `parent`: the
        base model /v1/models names for it (--lora-modules' base_model_name; default this one)."""
        if not self.lora_enabled:
            raise BadRequestError("LoRA adapters need a server started with --enable-lora.", param="lora_name")
        if not name or not path:
            raise BadRequestError("Both lora_name and lora_path are required.", param="lora_name" if not name else "lora_path")
        async with self._name_lock(name):  # the check and the record, with the engine's await between
            if name == self.card.id or (name in self.adapters and not inplace):
                raise BadRequestError(f"The LoRA adapter {name!r} has already been loaded.", param="lora_name")
            parent = parent or self.card.id
            request = LoRARequest(name, next(self._ids), path, base_model_name=parent)
            try:
                await engine.add_lora(request)
            except Exception as e:  # noqa: BLE001 - the engine's reason, as a 400 (or 503 if it is gone)
                raise from_engine_error(e) from None
            card = ModelCard(id=name, created=int(time.time()), root=path, parent=parent,
                             max_model_len=self.card.max_model_len)
            old = self.adapters.get(name)
            self.adapters[name] = (request, card)  # inplace: new requests get the new adapter (a new id)
            if old is not None:
                await self._remove_when_idle(engine, old[0])
            return request

    async def unload(self, engine: AsyncLLM, name: str) -> None:
        async with self._name_lock(name):
            if name not in self.adapters:
                raise NotFoundError(f"The LoRA adapter {name!r} is not loaded.", param="lora_name", code="model_not_found")
            request, _ = self.adapters[name]
            try:
                await engine.remove_lora(request.lora_int_id)
            except ValueError as e:  # the engine names the adapter by its id, which no client knows
                raise BadRequestError(_by_name(str(e), request), param="lora_name") from None
            except Exception as e:  # noqa: BLE001 - e.g. the engine is gone: a 503
                raise from_engine_error(e) from None
            del self.adapters[name]

    @contextlib.asynccontextmanager
    async def _name_lock(self, name: str) -> AsyncIterator[None]:
        """One load or unload of `name` at a time; the lock is dropped once nobody holds or awaits it."""
        lock, users = self._locks.get(name, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    async def _remove_when_idle(self, engine: AsyncLLM, old: LoRARequest) -> None:
        """Unload the replaced adapter; if requests still use it, it stays loaded (the engine
        refuses), which is harmless: nothing can reach it by name any more."""
        try:
            await engine.remove_lora(old.lora_int_id)
        except ValueError:
            pass

    async def load_static(self, engine: AsyncLLM, modules: tuple[LoRAModulePath, ...]) -> None:
        """--lora-modules, at startup: an adapter the engine refuses is a ValueError naming the entry."""
        for module in modules:
            if module.base_model_name not in (None, self.card.id):
                logger.warning("--lora-modules %s: base_model_name %r is not the served model %r; folio serves "
                               "adapters of the one model it loaded (/v1/models shows %r as its parent).",
                               module.name, module.base_model_name, self.card.id, module.base_model_name)
            try:
                await self.load(engine, module.name, module.path, parent=module.base_model_name)
            except Exception as e:  # noqa: BLE001
                message = getattr(e, "message", str(e))
                raise ValueError(f"--lora-modules {module.name}={module.path}: {message}") from None


def _by_name(message: str, request: LoRARequest) -> str:
    """The engine's message with the adapter's internal id replaced by its name."""
    return message.replace(f"Adapter id {request.lora_int_id} ", f"The LoRA adapter {request.lora_name!r} ")
