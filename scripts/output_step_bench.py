"""Host cost per engine step of turning 256 requests' new tokens into outputs, and of sending them
from the engine process to the server (CPU only; docs/perf-notes.md, sessions 10 and 12).

    python scripts/output_step_bench.py [--requests 256] [--steps 200]

The last two lines are the whole paths, as `folio serve` runs them (the engine process's output
processor makes streamed wire records, engine/wire.py): in the engine process, process_outputs
plus the pipe emit (encode, pickle, write) of a Stepped message, with a forked child draining the
pipe; and in the server, the reader thread's unpickle plus decode of the same messages. The lines
above them time the parts of the general path (full records).
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import time

from folio.core.outputs import EngineCoreOutput
from folio.engine.engine_core import _pipe_emit
from folio.engine.engine_loop import Stepped
from folio.engine.engine_stats import EngineStats
from folio.engine.output_processor import OutputProcessor
from folio.engine.wire import WireDecoder, WireEncoder
from folio.sampling_params import RequestOutputKind, SamplingParams

_STATS = EngineStats(256, 0, 10000, 5000, 0.5, 0)


def _processor(kind: RequestOutputKind, requests: int, wire: bool = False) -> tuple[OutputProcessor, list[str]]:
    processor = OutputProcessor(None)
    processor.isolate_errors = True
    processor.wire_records = wire
    params = SamplingParams(max_tokens=100000, ignore_eos=True, temperature=0.0, output_kind=kind)
    ids = [f"cmpl-{i:032x}" for i in range(requests)]
    for request_id in ids:
        processor.add_request(request_id, None, list(range(560)), params, [request_id], [params], time.time())
    return processor, ids


def _per_step(kind: RequestOutputKind, requests: int, steps: int) -> tuple[float, list]:
    processor, ids = _processor(kind, requests)
    start = time.perf_counter()
    outputs: list = []
    for step in range(steps):
        outputs, _ = processor.process_outputs([EngineCoreOutput(request_id, [step]) for request_id in ids])
    return (time.perf_counter() - start) / steps, outputs


def _timed(fn, reps: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def _drain(conn, done) -> None:
    while conn.recv_bytes() != b"stop":
        pass
    done.send(True)


def _engine_side(requests: int, steps: int) -> float:
    """process_outputs + emit (encode, pickle, pipe write) per step, a child draining the pipe."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    done_ours, done_theirs = context.Pipe()
    child = context.Process(target=_drain, args=(theirs, done_theirs), daemon=True)
    child.start()
    processor, ids = _processor(RequestOutputKind.DELTA, requests, wire=True)
    emit = _pipe_emit(ours)
    start = time.perf_counter()
    for step in range(steps):
        outputs, _ = processor.process_outputs([EngineCoreOutput(request_id, [step]) for request_id in ids])
        emit(Stepped(outputs, {}, _STATS, 0.007))
    seconds = (time.perf_counter() - start) / steps
    ours.send_bytes(b"stop")
    done_ours.recv()
    child.join()
    return seconds


def _server_side(requests: int, steps: int) -> float:
    """The reader thread's work per step: unpickle plus decode of the engine side's messages."""
    processor, ids = _processor(RequestOutputKind.DELTA, requests, wire=True)
    blobs = []

    class Sink:
        def send(self, message) -> None:
            blobs.append(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    emit = _pipe_emit(Sink())
    for step in range(steps):
        outputs, _ = processor.process_outputs([EngineCoreOutput(request_id, [step]) for request_id in ids])
        emit(Stepped(outputs, {}, _STATS, 0.007))
    decoder = WireDecoder()
    for request_id in ids:
        decoder.add(request_id, None, list(range(560)))
    start = time.perf_counter()
    for blob in blobs:
        message = pickle.loads(blob)
        [decoder.decode(w) for w in message.outputs]
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for kind in (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA):
        best = min(_per_step(kind, args.requests, args.steps)[0] for _ in range(3))
        print(f"process_outputs {kind.name}: {best * 1e3:.3f} ms/step")
    _, outputs = _per_step(RequestOutputKind.DELTA, args.requests, args.steps)
    encode = WireEncoder().full_record
    print(f"full records: {_timed(lambda: [encode(o) for o in outputs]) * 1e3:.3f} ms/step")
    wire = [encode(o) for o in outputs]
    message = Stepped(wire, {}, _STATS, 0.007)
    blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"pickle: {_timed(lambda: pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)) * 1e3:.3f} ms/step "
          f"to write, {_timed(lambda: pickle.loads(blob)) * 1e3:.3f} to read, {len(blob)} bytes")
    decoder = WireDecoder()
    for o in outputs:
        decoder.add(o.request_id, None, list(range(560)))
    print(f"decoding full records: {_timed(lambda: [decoder.decode(w) for w in wire]) * 1e3:.3f} ms/step")
    best = min(_engine_side(args.requests, args.steps) for _ in range(3))
    print(f"engine process, process_outputs + emit to the pipe: {best * 1e3:.3f} ms/step")
    best = min(_server_side(args.requests, args.steps) for _ in range(3))
    print(f"server reader, unpickle + decode: {best * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
