"""Host cost per engine step of turning 256 requests' new tokens into outputs, and of sending them
from the engine process to the server (CPU only; docs/perf-notes.md, session 10).

    python scripts/output_step_bench.py [--requests 256] [--steps 200]
"""

from __future__ import annotations

import argparse
import pickle
import time

from folio.core.outputs import EngineCoreOutput
from folio.engine.engine_core import EngineProcess, _encode
from folio.engine.engine_loop import Stepped
from folio.engine.engine_stats import EngineStats
from folio.engine.output_processor import OutputProcessor
from folio.sampling_params import RequestOutputKind, SamplingParams


def _processor(kind: RequestOutputKind, requests: int) -> tuple[OutputProcessor, list[str]]:
    processor = OutputProcessor(None)
    processor.isolate_errors = True
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for kind in (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA):
        best = min(_per_step(kind, args.requests, args.steps)[0] for _ in range(3))
        print(f"process_outputs {kind.name}: {best * 1e3:.3f} ms/step")
    _, outputs = _per_step(RequestOutputKind.DELTA, args.requests, args.steps)
    sent: set[str] = set()
    print(f"_encode: {_timed(lambda: [_encode(o, sent) for o in outputs]) * 1e3:.3f} ms/step")
    wire = [_encode(o, sent) for o in outputs]
    blob = pickle.dumps(Stepped(wire, {}, EngineStats(256, 0, 10000, 5000, 0.5, 0), 0.007), protocol=pickle.HIGHEST_PROTOCOL)
    print(f"pickle + unpickle: {_timed(lambda: pickle.loads(blob)) * 1e3:.3f} ms/step to read, {len(blob)} bytes")
    frontend = EngineProcess.__new__(EngineProcess)
    frontend._prompts = {o.request_id: (None, list(range(560))) for o in outputs}
    print(f"server _decode: {_timed(lambda: [frontend._decode(w) for w in wire]) * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
