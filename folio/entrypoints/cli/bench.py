"""`folio bench throughput` (offline, against transformers, vLLM and the physical floor),
`folio bench latency` (time to first token, decode per token) and `folio bench serve` (a request
stream against any OpenAI-compatible server).

docs/benchmarks.md says what each number means and gives the commands of the reference runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from folio.benchmarks.workloads import WORKLOADS, Workload

if TYPE_CHECKING:
    from folio.benchmarks.hardware import DeviceLimits
    from folio.benchmarks.report import ThroughputReport
    from folio.benchmarks.result import RunResult
    from folio.benchmarks.vllm_peer import TimedCall, VllmJob
    from folio.config import EngineConfig
    from folio.engine.arg_utils import EngineArgs


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmark throughput (offline) or a running server")
    bench.set_defaults(run=lambda args: _usage(bench))
    kinds = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    _register_throughput(kinds)
    _register_latency(kinds)
    _register_serve(kinds)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="w1", choices=WORKLOADS, help="w1 (DESIGN.md) or random lengths")
    g.add_argument("--input-len", type=int, default=None, help="random: mean prompt length")
    g.add_argument("--output-len", type=int, default=None, help="random: mean output length")
    g.add_argument("--num-prompts", type=int, default=None, help="random: request count; w1: its first N")
    g.add_argument("--range-ratio", type=float, default=0.0, help="random: lengths in len*(1±ratio)")
    g.add_argument("--workload-seed", type=int, default=0, help="random: seed of the draws")
    g.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the results here")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


# ---- throughput ----------------------------------------------------------------------------
def _register_throughput(kinds: argparse._SubParsersAction) -> None:
    from folio.engine.arg_utils import EngineArgs

    p = kinds.add_parser("throughput", help="offline throughput, with peers and the physical floor")
    _add_workload_args(p)
    g = p.add_argument_group("comparison")
    g.add_argument("--peer", action="append", default=[], choices=["transformers", "vllm"],
                   help="also run this system on the same requests, in the same run (vllm: in a child "
                        "process, from $FOLIO_VLLM_SITE or /tmp/vsite)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every request (0: greedy), for folio and the vllm peer")
    g.add_argument("--peer-modes", default="cb,generate",
                   help="transformers modes, comma-separated: cb (continuous batching), generate (static)")
    g.add_argument("--peer-num-requests", type=int, default=None,
                   help="run peers on the first N requests only (their tok/s are measured on that subset)")
    g.add_argument("--peer-batch-size", type=int, default=64, help="static generate batch size")
    g.add_argument("--no-floor", action="store_true", help="do not measure the device nor compute the floor")
    g.add_argument("--disable-detokenize", action="store_true", help="folio returns token ids only, no text")
    g.add_argument("--no-warmup", action="store_true", help="time the first generate too")
    g.add_argument("--structured", default=None, choices=["json-schema"],
                   help="a JSON schema per request, beside the same batch unconstrained (no peers, no floor)")
    EngineArgs.add_cli_args(p)
    p.set_defaults(run=run_throughput)


def run_throughput(args: argparse.Namespace) -> int:
    from folio.benchmarks.report import ThroughputReport
    from folio.benchmarks.throughput import run_folio
    from folio.engine.arg_utils import EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()  # resolves model, dtype and device, loads nothing
    workload = _workload(args, config.model.vocab_size)
    peer_modes = _peer_modes(args)
    max_len = workload.max_total_len
    if max_len > config.model.max_model_len:
        raise ValueError(f"The workload needs {max_len} tokens of context; the model allows {config.model.max_model_len}.")
    _say(f"workload: {workload.describe()}")
    if args.structured:
        return _run_structured(engine_args, config, workload, args)
    peer_workload = workload.head(args.peer_num_requests) if args.peer else None
    limits = None if args.no_floor else _measure(config.device.device)
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}.")
    if args.temperature > 0 and "transformers" in args.peer:
        raise ValueError("--temperature applies to folio and the vllm peer; the transformers peer is greedy only.")
    # vLLM first, in a child process that exits before folio starts: each engine finds the
    # device empty (vLLM refuses to start when less than its memory share is free).
    vllm_result = None
    if "vllm" in args.peer:
        vllm_result = _run_vllm_throughput(peer_workload or workload, engine_args, args, config)
    folio = run_folio(engine_args, workload, subset=peer_workload, detokenize=not args.disable_detokenize,
                      warmup=not args.no_warmup, progress=not args.no_progress, temperature=args.temperature)
    report = ThroughputReport(
        model=folio.model_path, dtype=folio.dtype, device=folio.device, load_format=engine_args.load_format,
        workload=workload, folio=folio.result, limits=limits, engine_stats=folio.engine_stats,
        peer_workload=peer_workload,
    )
    if folio.subset_result is not None:
        report.folio_subset = dataclasses.replace(folio.subset_result, system="folio (peer subset)")
    if "transformers" in args.peer:
        _run_peers(report, engine_args, args, peer_modes)
    if vllm_result is not None:
        report.peers.append(vllm_result)
    if not args.no_floor:
        _add_floor(report, engine_args)
    print(report.format_text())
    if args.json_path:
        report.write_json(args.json_path)
        _say(f"results written to {args.json_path}")
    return 0 if folio.result.ok else 1


def _run_structured(engine_args: EngineArgs, config: Any, workload: Workload, args: argparse.Namespace) -> int:
    from folio.benchmarks.structured import run_structured, with_bench_tokenizer

    engine_args, note = with_bench_tokenizer(engine_args, config.model.model, config.model.vocab_size)
    if note:
        _say(note)
    run = run_structured(engine_args, workload, progress=not args.no_progress)
    print(run.format_text())
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"structured": run.structured.to_dict(), "unconstrained": run.unconstrained.to_dict(),
                       "grammar_host_ms_per_step": run.grammar_host_ms_per_step, "steps": run.steps,
                       "mask_device_ms": run.mask_device_ms, "compile_ms_per_schema": run.compile_ms,
                       "first_compile_ms": run.first_compile_ms, "grammar_backend_build_ms": run.backend_build_ms}, f, indent=2)
    return 0 if run.unconstrained.ok else 1


def _workload(args: argparse.Namespace, vocab_size: int | None) -> Workload:
    from folio.benchmarks.workloads import make_workload

    workload = make_workload(
        args.workload, input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
        range_ratio=args.range_ratio, vocab_size=vocab_size, seed=args.workload_seed,
    )
    if vocab_size is not None:
        top = max((max(r.prompt_token_ids) for r in workload.requests), default=0)
        if top >= vocab_size:
            raise ValueError(f"The {args.workload} workload uses token id {top}; the model's vocabulary has {vocab_size}.")
    return workload


def _peer_modes(args: argparse.Namespace) -> tuple[str, ...]:
    from folio.benchmarks.peers import PEER_MODES

    modes = tuple(m.strip() for m in args.peer_modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in PEER_MODES]
    if unknown or not modes:
        raise ValueError(f"--peer-modes takes a comma-separated subset of {', '.join(PEER_MODES)}, got {args.peer_modes!r}.")
    return modes


def _measure(device: str) -> DeviceLimits | None:
    from folio.benchmarks.hardware import measure_device

    limits = measure_device(device)
    _say(f"device: {limits.describe()}" if limits else f"device: {device}, not measured (no floor on the CPU)")
    return limits


def _run_peers(report: ThroughputReport, engine_args: EngineArgs, args: argparse.Namespace,
               modes: tuple[str, ...]) -> None:
    from folio.benchmarks.peers import PeerSpec, run_transformers
    from folio.benchmarks.throughput import device_memory_in_use

    left = device_memory_in_use()
    if left:
        report.notes.append(f"{left / 2**30:.2f} GiB of GPU memory still allocated after folio was freed")
    spec = PeerSpec(report.model, report.dtype, report.device, engine_args.load_format == "dummy", engine_args.seed)
    peer_workload = report.peer_workload or report.workload
    _say(f"transformers on {peer_workload.describe()}")
    report.peers = run_transformers(spec, peer_workload, modes=modes,
                                    batch_size=args.peer_batch_size, progress=not args.no_progress)


def _vllm_job(engine_args: EngineArgs, model: str, dtype: str, calls: list[TimedCall]) -> VllmJob:
    from folio.benchmarks.vllm_peer import VllmJob, split_engine_args

    passed, folio_only = split_engine_args(engine_args)
    if folio_only:
        _say(f"the vllm peer runs without folio's {', '.join(folio_only)} (vLLM has no such argument)")
    return VllmJob(model=model, dtype=dtype, dummy_weights=engine_args.load_format == "dummy",
                   max_model_len=engine_args.max_model_len, seed=engine_args.seed, calls=calls,
                   engine_kwargs=passed)


def _run_vllm_throughput(
    workload: Workload, engine_args: EngineArgs, args: argparse.Namespace, config: EngineConfig
) -> RunResult:
    """vLLM on the peers' requests in the same order, after the twin of folio's untimed warm-up."""
    from folio.benchmarks.result import RunResult
    from folio.benchmarks.throughput import warmup_workloads
    from folio.benchmarks.vllm_peer import TimedCall, run_vllm, vllm_version

    version = vllm_version()
    if version is None:
        return RunResult.failed("vllm", workload.name, workload.num_requests, "vllm does not import")
    system = f"vllm {version}"
    warm = warmup_workloads(config.model.vocab_size, config.model.max_model_len)
    calls = [
        TimedCall(name, [r.prompt_token_ids for r in w.requests], [r.output_len for r in w.requests],
                  args.temperature, repeat=1, warmup=False)
        for name, w in (*((f"warmup-{i}", w) for i, w in enumerate(warm)), ("run", workload))
    ]
    _say(f"{system} on {workload.describe()}")
    try:
        result = run_vllm(_vllm_job(engine_args, config.model.model, config.model.dtype, calls))[-1]
    except Exception as e:  # noqa: BLE001 - a peer failure is reported, not raised
        return RunResult.failed(system, workload.name, workload.num_requests, f"{type(e).__name__}: {e}")
    return RunResult.measured(system, workload, result.produced, result.elapsed_s[0])


# ---- latency -------------------------------------------------------------------------------
def _register_latency(kinds: argparse._SubParsersAction) -> None:
    from folio.engine.arg_utils import EngineArgs

    p = kinds.add_parser("latency", help="time to first token of long prompts; decode ms/token at batch 1 and 64")
    g = p.add_argument_group("latency")
    g.add_argument("--prompt-lens", default="8192,30000", help="time to first token of one prompt of each length")
    g.add_argument("--batch-sizes", default="1,64", help="decode speed at each batch size")
    g.add_argument("--decode-prompt-len", type=int, default=128, help="prompt length of the decode batches")
    g.add_argument("--decode-steps", type=int, default=512, help="decode calls use max_tokens 1 + this")
    g.add_argument("--repeat", type=int, default=3, help="timed calls per figure (the median is reported)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--peer", action="append", default=[], choices=["vllm"], help="the same calls through vLLM")
    g.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the results here")
    EngineArgs.add_cli_args(p)
    p.set_defaults(run=run_latency)


def run_latency(args: argparse.Namespace) -> int:
    from folio import LLM
    from folio.benchmarks.latency import LatencySpec, format_rows, run_calls, summarise
    from folio.benchmarks.throughput import release_device_memory
    from folio.benchmarks.vllm_peer import run_vllm, vllm_version
    from folio.engine.arg_utils import EngineArgs

    spec = LatencySpec(prompt_lens=_ints(args.prompt_lens, "--prompt-lens"),
                       batch_sizes=_ints(args.batch_sizes, "--batch-sizes"),
                       decode_prompt_len=args.decode_prompt_len, decode_steps=args.decode_steps,
                       repeat=args.repeat, temperature=args.temperature)
    engine_args = EngineArgs.from_cli_args(args)
    if engine_args.max_model_len is None or engine_args.max_model_len < spec.max_model_len:
        engine_args = dataclasses.replace(engine_args, max_model_len=spec.max_model_len)
    config = engine_args.create_engine_config()  # resolves model, dtype and device, loads nothing
    model, dtype = config.model.model, config.model.dtype
    spec = dataclasses.replace(spec, vocab_limit=min(spec.vocab_limit, config.model.vocab_size))
    calls = spec.calls()
    peers = {}
    if "vllm" in args.peer:  # first, in a child that exits before folio starts (see run_throughput)
        version = vllm_version()
        if version is None:
            _say("vllm does not import: no peer column")
        else:
            peers[f"vllm {version}"] = summarise(spec, run_vllm(_vllm_job(engine_args, model, dtype, calls)))
    llm = LLM(**vars(engine_args))
    systems = {"folio": summarise(spec, run_calls(llm, calls)), **peers}
    del llm
    release_device_memory()
    print(format_rows(systems))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"spec": dataclasses.asdict(spec), "model": model, "dtype": dtype,
                       "systems": {k: [dataclasses.asdict(r) for r in v] for k, v in systems.items()}}, f, indent=2)
            f.write("\n")
    return 0 if all(r.exact for rows in systems.values() for r in rows) else 1


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}.") from None


def _add_floor(report: ThroughputReport, engine_args: EngineArgs) -> None:
    from folio.benchmarks.floor import compute_floor, model_cost, workload_cost

    try:
        report.model_cost = model_cost(report.model, report.dtype, engine_args.quantization,
                                       engine_args.kv_cache_dtype)
    except Exception as e:  # noqa: BLE001 - an architecture transformers cannot build: no floor
        report.notes.append(f"floor not computed: {type(e).__name__}: {e}")
        return
    report.workload_cost = workload_cost(report.workload, report.model_cost.sliding_window)
    report.floor = compute_floor(report.model_cost, report.workload_cost, report.limits)


# ---- serve ---------------------------------------------------------------------------------
def _register_serve(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("serve", help="send a request stream to a running OpenAI-compatible server")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the model name the server serves")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--request-rate", default="inf", help="requests per second (Poisson arrivals), or inf")
    p.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    p.add_argument("--vocab-size", type=int, default=None, help="random: keep token ids below this")
    p.add_argument("--ready-timeout", type=float, default=0.0,
                   help="wait up to this many seconds for the server to answer /v1/models")
    p.add_argument("--warmup-requests", type=int, default=1,
                   help="untimed requests sent first, all at once (the workload's first, prompts reversed, "
                        "<= 16 tokens each)")
    p.add_argument("--http-client", choices=("asyncio", "httpx"), default="asyncio",
                   help="the client that sends the requests: a lean one on asyncio's streams (default), or httpx, "
                        "which costs more client time a request and a token")
    _add_workload_args(p)
    p.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from folio.benchmarks.serve import ServeOptions, run_serve_benchmark
    from folio.benchmarks.serve_metrics import format_metrics

    workload = _workload(args, args.vocab_size)
    options = ServeOptions(
        base_url=args.base_url, model=args.model, endpoint=args.endpoint,
        request_rate=_rate(args.request_rate), max_concurrency=args.max_concurrency,
        seed=args.seed, ready_timeout_s=args.ready_timeout, progress=not args.no_progress,
        warmup_requests=args.warmup_requests, http_client=args.http_client,
    )
    _say(f"workload: {workload.describe()}; rate {args.request_rate} req/s, "
         f"max concurrency {args.max_concurrency or 'unlimited'}")
    run = run_serve_benchmark(workload, options)
    if args.ready_timeout > 0:
        _say(f"the server answered {run.server_wait_s:.1f} s after the benchmark started waiting")
    print(format_metrics(run.metrics))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"base_url": args.base_url, "model": args.model, "workload": workload.name,
                       "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
                       "server_wait_s": run.server_wait_s, "warmup_requests": args.warmup_requests,
                       "http_client": args.http_client,
                       **run.metrics.to_dict()}, f, indent=2)
            f.write("\n")
    return 0 if run.metrics.failed == 0 and run.metrics.exact_lengths == run.metrics.completed else 1


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"--request-rate must be a number or inf, got {text!r}.") from None
    if math.isnan(rate) or rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {text!r}.")
    return rate


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
