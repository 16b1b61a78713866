"""vLLM's `vllm serve` flags that folio's own table (folio/engine/vllm_args.py) does not list.

folio/engine/vllm_args.py covers the vLLM arguments folio takes or refuses by value; these are
the rest of vLLM's engine and frontend flags, by argument name. They only shape the error for an
unknown flag: "a vLLM flag folio does not support" instead of argparse's bare "unrecognized
arguments", so a vLLM user knows the flag is real and that folio lacks it.
"""

from __future__ import annotations

from folio.engine.vllm_args import VLLM_ARGS

# fmt: off
_ENGINE = (
    # ModelConfig
    "hf_config_path", "runner", "convert", "task", "enable_prompt_embeds", "tokenizer_mode", "trust_remote_code",
    "allowed_local_media_path", "allowed_media_domains", "config_format", "code_revision", "tokenizer_revision",
    "rope_scaling", "rope_theta", "max_seq_len_to_capture", "disable_sliding_window", "disable_cascade_attn",
    "logprobs_mode", "model_impl", "override_attention_dtype", "enable_return_routed_experts", "model_weights",
    "io_processor_plugin", "override_pooler_config", "override_neuron_config",
    # LoadConfig
    "download_dir", "safetensors_load_strategy", "model_loader_extra_config", "ignore_patterns",
    "pt_load_map_location", "qlora_adapter_name_or_path",
    # ParallelConfig
    "pipeline_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size",
    "dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size", "data_parallel_size", "data_parallel_rank",
    "data_parallel_start_rank", "data_parallel_size_local", "data_parallel_address", "data_parallel_rpc_port",
    "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_backend", "enable_expert_parallel",
    "all2all_backend", "enable_eplb", "eplb_config", "expert_placement_strategy", "enable_dbo", "ubatch_size",
    "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "disable_nccl_for_dp_synchronization",
    "max_parallel_loading_workers", "ray_workers_use_nsight", "disable_custom_all_reduce", "worker_cls",
    "worker_extension_cls", "enable_multimodal_encoder_data_parallel", "distributed_timeout_seconds",
    # CacheConfig
    "prefix_caching_hash_algo", "cpu_offload_gb", "kv_cache_memory_bytes", "calculate_kv_scales",
    "kv_sharing_fast_prefill", "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_block_size",
    "kv_offloading_size", "kv_offloading_backend",
    # MultiModalConfig
    "limit_mm_per_prompt", "interleave_mm_strings", "media_io_kwargs", "mm_processor_kwargs",
    "mm_processor_cache_gb", "mm_processor_cache_type", "mm_shm_cache_max_object_size_mb", "mm_encoder_tp_mode",
    "skip_mm_profiling", "video_pruning_rate", "disable_mm_preprocessor_cache",
    # LoRAConfig
    "enable_lora_bias", "default_mm_loras", "fully_sharded_loras", "lora_dtype", "lora_extra_vocab_size",
    "long_lora_scaling_factors",
    # SchedulerConfig
    "max_num_partial_prefills", "max_long_partial_prefills", "long_prefill_token_threshold",
    "num_lookahead_slots", "scheduler_delay_factor", "cuda_graph_sizes", "disable_chunked_mm_input",
    "disable_hybrid_kv_cache_manager", "scheduler_cls", "stream_interval", "num_scheduler_steps",
    "multi_step_stream_outputs",
    # ObservabilityConfig, VllmConfig and the rest
    "disable_log_stats", "aggregate_engine_logging", "kv_cache_metrics", "cudagraph_metrics",
    "reasoning_parser", "reasoning_parser_plugin", "guided_decoding_backend", "kv_events_config",
    "ec_transfer_config", "additional_config", "cudagraph_capture_sizes", "max_cudagraph_capture_size",
    "optimization_level", "disable_async_output_proc", "speculative_model", "num_speculative_tokens",
)
_FRONTEND = (
    "uds", "uvicorn_log_level", "disable_uvicorn_access_log", "allow_credentials", "allowed_origins",
    "allowed_methods", "allowed_headers", "lora_modules", "prompt_adapters", "chat_template",
    "chat_template_content_format", "trust_request_chat_template", "response_role", "ssl_keyfile",
    "ssl_certfile", "ssl_ca_certs", "enable_ssl_refresh", "ssl_cert_reqs", "root_path", "middleware",
    "return_tokens_as_token_ids", "disable_frontend_multiprocessing", "enable_request_id_headers",
    "enable_auto_tool_choice", "exclude_tools_when_tool_choice_none", "tool_call_parser", "tool_parser_plugin",
    "tool_server", "log_config_file", "max_log_len", "disable_fastapi_docs", "enable_prompt_tokens_details",
    "enable_server_load_tracking", "enable_force_include_usage", "enable_tokenizer_info_endpoint",
    "enable_log_outputs", "h11_max_incomplete_event_size", "h11_max_header_count", "log_error_stack",
    "api_server_count", "headless", "config", "disable_log_requests", "enable_log_requests",
)
# fmt: on

VLLM_FLAG_NAMES: frozenset[str] = frozenset(_ENGINE + _FRONTEND) | {row.name for row in VLLM_ARGS}


def is_vllm_flag(flag: str) -> bool:
    """Whether `--some-flag` (or `--some_flag`) names one of vLLM's arguments."""
    return flag.startswith("--") and flag[2:].replace("-", "_") in VLLM_FLAG_NAMES
