"""Bad checkpoints and engine arguments fail at startup with a ValueError naming the file or the
flag, never with a traceback from deep inside (a review found each of these): a truncated
safetensors file, invalid sizes in config.json or --hf-overrides, non-finite cache sizes, a
seed beyond 64 bits, bad --override-generation-config values, and buffer sizes the machine
cannot hold. Flags that do nothing in the setup at hand are warned about, once."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from folio import LLM
from folio.config import CacheConfig
from folio.config import engine as engine_config
from folio.engine.arg_utils import EngineArgs
from folio.models.weight_utils import iterate_weights
from folio.transformers_utils.tokenizer import get_tokenizer
from folio.worker.allocation import named_allocation
from tests.helpers.checkpoints import tiny_model_dir


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "startup-errors")


def _copy_with_config(model: str, tmp_path, **changes) -> str:
    """A copy of the checkpoint whose config.json has `changes` (None deletes the key)."""
    path = str(tmp_path / "copy")
    shutil.copytree(model, path)
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    for key, value in changes.items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    with open(config_path, "w") as f:
        json.dump(config, f)
    return path


def _config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", max_model_len=256, **kwargs).create_engine_config()


# ---- the checkpoint -------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "value"), [("num_hidden_layers", "two"), ("hidden_size", None),
                                            ("vocab_size", 0), ("num_attention_heads", True),
                                            ("max_position_embeddings", -1), ("head_dim", 2.5)])
def test_bad_sizes_in_config_json_name_the_file_and_the_field(model, tmp_path, key, value):
    path = _copy_with_config(model, tmp_path, **{key: value})
    with pytest.raises(ValueError, match=f"config.json.*{key}") as err:
        _config(path)
    assert path in str(err.value)


@pytest.mark.parametrize("overrides", [{"num_hidden_layers": 0}, {"max_position_embeddings": -1},
                                       {"hidden_size": "big"}, {"num_key_value_heads": 0}])
def test_bad_sizes_in_hf_overrides_name_the_flag(model, overrides):
    (key,) = overrides
    with pytest.raises(ValueError, match=rf"hf_overrides \(--hf-overrides\): {key} must be a positive integer"):
        _config(model, hf_overrides=overrides)


def test_null_optional_sizes_are_still_accepted(model, tmp_path):
    path = _copy_with_config(model, tmp_path, head_dim=None, num_key_value_heads=None)
    assert _config(path).model.num_kv_heads == 6


def test_a_truncated_safetensors_file_is_named(model, tmp_path):
    path = str(tmp_path / "model.safetensors")
    shutil.copy(os.path.join(model, "model.safetensors"), path)
    os.truncate(path, os.path.getsize(path) // 2)
    for sliced in (False, True):
        with pytest.raises(ValueError, match=f"Cannot read checkpoint file {path}"):
            list(iterate_weights([path], "safetensors", sliced=sliced))
    os.truncate(path, 4)  # not even a header
    with pytest.raises(ValueError, match="damaged or incomplete"):
        list(iterate_weights([path], "safetensors"))


def test_transformers_validation_of_config_json_is_a_value_error(model, tmp_path):
    path = _copy_with_config(model, tmp_path, rms_norm_eps="x")
    with pytest.raises(ValueError, match=r"config.json is invalid: .*rms_norm_eps"):
        get_tokenizer(path)


# ---- engine arguments -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [10**23, 2**64, -(2**63) - 1])
def test_a_seed_beyond_64_bits_is_named(model, seed):
    with pytest.raises(ValueError, match=r"seed \(--seed\) must be an integer that fits in 64 bits"):
        _config(model, seed=seed)


def test_seeds_at_the_64_bit_bounds_pass(model):
    assert _config(model, seed=2**64 - 1).model.seed == 2**64 - 1
    assert _config(model, seed=-(2**63)).model.seed == -(2**63)


@pytest.mark.parametrize(("field", "flag", "value"), [
    ("cpu_kv_cache_space_gib", "--cpu-kv-cache-space", float("inf")),
    ("cpu_kv_cache_space_gib", "--cpu-kv-cache-space", float("nan")),
    ("cpu_kv_cache_space_gib", "--cpu-kv-cache-space", -1.0),
    ("cpu_kv_cache_space_gib", "--cpu-kv-cache-space", 0),
    ("swap_space_gib", "--swap-space", float("nan")),
    ("swap_space_gib", "--swap-space", float("inf")),
    ("swap_space_gib", "--swap-space", -0.5),
])
def test_cache_sizes_must_be_finite_and_name_the_users_flag(field, flag, value):
    with pytest.raises(ValueError, match=f"{flag}") as err:
        CacheConfig(**{field: value})
    assert "_gib" not in str(err.value)
    assert CacheConfig(swap_space_gib=0).swap_space_gib == 0


@pytest.mark.parametrize("overrides", [{"temperature": "hot"}, {"top_k": 1.5}, {"top_p": 2},
                                       {"max_new_tokens": 0}, {"eos_token_id": "x"}])
def test_bad_override_generation_config_is_an_error_naming_the_flag(model, overrides):
    (key,) = overrides
    with pytest.raises(ValueError, match=rf"--override-generation-config\): '{key}'"):
        _config(model, override_generation_config=overrides)


def test_the_checkpoints_own_generation_config_may_stay_invalid(model, tmp_path):
    path = _copy_with_config(model, tmp_path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"temperature": "hot"}, f)
    assert _config(path).model.generation_config["temperature"] == "hot"  # the engine warns, serves on
    assert _config(path, override_generation_config={"temperature": 0.5}).model.generation_config["temperature"] == 0.5


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"max_num_seqs": 10**12}, "--max-num-seqs"),
    ({"max_num_batched_tokens": 10**12}, "--max-num-batched-tokens"),
    ({"enable_lora": True, "max_loras": 10**12}, "--max-loras"),
    ({"num_gpu_blocks_override": 10**12}, "--num-gpu-blocks-override"),
    ({"swap_space": 1e30}, "--swap-space"),
])
def test_buffers_the_machine_cannot_hold_are_refused_up_front(model, kwargs, flag):
    with pytest.raises(ValueError, match=rf"\({flag}\) = .* would need at least .* GiB of host memory"):
        _config(model, **kwargs)


def test_an_allocation_failure_names_the_flags():
    message = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8000000000 bytes."
    with pytest.raises(ValueError, match=r"max_num_seqs \(--max-num-seqs\).*") as err:
        with named_allocation("the step buffers", "max_num_seqs"):
            raise RuntimeError(message)
    assert "8000000000 bytes" in str(err.value)
    with pytest.raises(ValueError, match="119. GiB"), named_allocation("x", "max_loras"):
        raise MemoryError("Unable to allocate 119. GiB for an array with shape (2000000000, 16)")
    with pytest.raises(RuntimeError, match="unrelated"), named_allocation("x", "max_loras"):
        raise RuntimeError("unrelated")


def test_the_runner_turns_its_allocation_failures_into_value_errors(model, monkeypatch):
    import folio.worker.model_runner as model_runner

    def fail(*args, **kwargs):
        raise MemoryError("Unable to allocate 44.7 GiB for an array")

    monkeypatch.setattr(model_runner, "StepInputBuilder", fail)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(--max-num-batched-tokens\)"):
        LLM(model, device="cpu", max_model_len=256)


def test_a_kv_cache_too_small_on_the_cpu_names_the_cpu_flag(model):
    with pytest.raises(ValueError, match=r"cpu_kv_cache_space \(--cpu-kv-cache-space\)") as err:
        LLM(model, device="cpu", max_model_len=256, cpu_kv_cache_space=0.00001)
    assert "gpu_memory_utilization" not in str(err.value)


# ---- flags that do nothing here -------------------------------------------------------------------
@pytest.fixture
def warnings_seen(monkeypatch):
    """The folio.config.engine warnings of the test (folio's loggers do not propagate to caplog)."""
    monkeypatch.setattr(engine_config, "_WARNED", set())
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    engine_config.logger.addHandler(handler)
    yield seen
    engine_config.logger.removeHandler(handler)


def test_gpu_memory_utilization_on_the_cpu_warns_once_naming_the_cpu_flag(model, warnings_seen):
    _config(model, gpu_memory_utilization=0.5)
    _config(model, gpu_memory_utilization=0.5)
    (warning,) = warnings_seen
    assert "--gpu-memory-utilization" in warning and "--cpu-kv-cache-space" in warning
    _config(model)  # the default: nothing to say
    assert len(warnings_seen) == 1


def test_master_addr_with_one_rank_warns(model, warnings_seen):
    _config(model, master_addr="10.0.0.1")
    assert any("--master-addr" in w and "tensor_parallel_size 1" in w for w in warnings_seen)
