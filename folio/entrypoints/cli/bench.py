"""`folio bench throughput` (offline, against transformers and the physical floor) and
`folio bench serve` (a request stream against any OpenAI-compatible server).

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
    from folio.engine.arg_utils import EngineArgs


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmark throughput (offline) or a running server")
    bench.set_defaults(run=lambda args: _usage(bench))
    kinds = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    _register_throughput(kinds)
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
    g.add_argument("--peer", action="append", default=[], choices=["transformers"],
                   help="also run this system on the same requests, in the same run")
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
    folio = run_folio(engine_args, workload, subset=peer_workload, detokenize=not args.disable_detokenize,
                      warmup=not args.no_warmup, progress=not args.no_progress)
    report = ThroughputReport(
        model=folio.model_path, dtype=folio.dtype, device=folio.device, load_format=engine_args.load_format,
        workload=workload, folio=folio.result, limits=limits, engine_stats=folio.engine_stats,
        peer_workload=peer_workload,
    )
    if folio.subset_result is not None:
        report.folio_subset = dataclasses.replace(folio.subset_result, system="folio (peer subset)")
    if args.peer:
        _run_peers(report, engine_args, args, peer_modes)
    if not args.no_floor:
        _add_floor(report)
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
                       "mask_device_ms": run.mask_device_ms, "compile_ms_per_schema": run.compile_ms}, f, indent=2)
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


def _add_floor(report: ThroughputReport) -> None:
    from folio.benchmarks.floor import compute_floor, model_cost, workload_cost

    try:
        report.model_cost = model_cost(report.model, report.dtype)
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
                       "server_wait_s": run.server_wait_s,
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
