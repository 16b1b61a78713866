#!/usr/bin/env bash
# One GPU session's checks and measurements, in parts that each fit a 10-minute device call.
#   bash scripts/gpu_session.sh PART...   (PART: warm-machine (first, on a fresh machine) tests w1 llama serve serve-sync serve-process serve-rate ingest prefix
#   peers-qwen peers-qwen-cb peers-qwen-generate peers-llama; issue 11: perf-tests kernels-prefill
#   kernels-sampling latency-qwen latency-llama w1-qwen-t06 w1-qwen-greedy w1-llama-t06
#   vllm-install, and with vLLM in /tmp/vsite: vs-vllm-qwen vs-vllm-llama vs-vllm-latency-qwen
#   vs-vllm-latency-llama vs-vllm-short-qwen vs-vllm-short-llama vs-vllm-prefill-profile vs-vllm-quant-llama vs-vllm-serve-rate; short-ttft-qwen short-ttft-llama; this wave: wave-tests structured w1-tokenizer quant quant-w1 prefill-profile w1-profile kernels-decode kernels-fp8 fp8-tests kernels-quant kernels-quant-ab quant-decode latency-gap prefill-gluon decode-profile decode-splits pdl-ab decode-ab pdl-tests ncu-gemv tp spec-pair spec spec-timeline spec-profile lora dashboard)
# vLLM (issue 11): copy /work/shared/tools/vllm-peer/install.sh and the parts made by its build.sh
# into a carried folder, e.g. .vllm/{install.sh,v0,v1,v2}; `VLLM_PARTS=.vllm VLLM_NPARTS=3 bash
# scripts/gpu_session.sh vllm-install` in each of the consecutive calls that carry a part.
# Writes logs and JSON under $OUT (default ./gpu-out). Run from the repository root; no install.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
# Packages the GPU image lacks travel as wheels in .whl/ (scripts/gpu_wheels.sh fetches them).
if [ -d .whl ] && ! python3 -c "import fastapi, uvicorn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  SITE=/tmp/site:
fi
export PYTHONPATH=${SITE:-}. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
QWEN=folio/benchmarks/configs/qwen3-0.6b; LLAMA=folio/benchmarks/configs/llama-3.1-8b
COMMON="--load-format dummy --dtype bfloat16 --max-model-len 4096"
part() { echo "=== $1 $(date +%T)"; }
# The 8B's quantization arguments by name: bf16 (none), fp8 (weights), fp8-kv (weights and KV cache).
quant_args() { case $1 in bf16|none) echo "";; fp8-kv) echo "--quantization fp8 --kv-cache-dtype fp8";; *) echo "--quantization $1";; esac; }
# W1 on the 8B once per quantization named (W1_TAG: a suffix for the JSON names of an A/B run).
quant_w1() {
  for Q in "$@"; do
    timeout 240 python3 -m folio bench throughput --model $LLAMA $COMMON --workload w1 --no-floor $(quant_args $Q) \
      --no-progress --json "$OUT/quant-w1-$Q${W1_TAG:-}.json" 2>&1 | grep -vE "INFO|it/s" | tail -8
  done
}
for p in "$@"; do case $p in
warm-machine) part warm-machine  # a throwaway W1 run: a fresh machine's first process runs 5-8% slower (session 21)
  timeout 150 python3 -m folio bench throughput --model $QWEN $COMMON --workload w1 --no-floor --no-progress \
    2>&1 | grep -E "^ *folio" | head -1 ;;
tests) part tests
  timeout 450 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/sample/test_sampler_gpu.py \
    tests/worker tests/prefix/test_block_ops.py tests/engine/test_async_scheduling.py 2>&1 | tail -25 | tee "$OUT/gpu-tests.txt" ;;
w1) part w1
  timeout 200 python3 scripts/w1_offline.py --timeline --modes async,sync --out "$OUT/w1-qwen" 2>&1 | grep -v "it/s" | tail -70 ;;
llama) part llama
  timeout 200 python3 scripts/w1_offline.py --timeline --modes async --config llama-3.1-8b --out "$OUT/w1-llama" 2>&1 | tail -40 ;;
serve|serve-sync|serve-process) part $p
  case $p in serve) EXTRA="";; serve-sync) EXTRA="--no-async-scheduling";; serve-process) EXTRA="--engine-process";; esac
  PORT=18123
  timeout 200 python3 -m folio serve --model $QWEN $COMMON --served-model-name qwen3-0.6b --port $PORT $EXTRA > "$OUT/$p.log" 2>&1 &
  SERVER_PID=$!  # timeout's PID: it passes the TERM below on to the server
  # SERVE_RUNS=2: W1 again on the same server (its prompts then hit the prefix cache); SERVE_CLIENT=httpx:
  # the benchmark's old client (session 21)
  for R in $(seq 1 ${SERVE_RUNS:-1}); do
    timeout 190 python3 -m folio bench serve --base-url http://127.0.0.1:$PORT --model qwen3-0.6b --workload w1 \
      --ready-timeout 120 --warmup-requests ${SERVE_WARMUP:-1} --http-client ${SERVE_CLIENT:-asyncio} --no-progress --json "$OUT/$p-qwen3-0.6b-w1${R#1}.json" 2>&1 | grep -E "wait|duration|Output token|TTFT|ITL|Failed"
  done
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:$PORT/metrics').text)" | grep -E "^folio:engine_step"
  kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; grep -E "ready in|ERROR|Traceback" "$OUT/$p.log" | head -5 ;;
serve-rate) part serve-rate  # requests arriving at a rate: new prompts join running decodes (chunk graphs, session 24)
  PORT=18124  # SERVE_CHUNK_GRAPHS=0: those steps run eagerly (FOLIO_CHUNK_GRAPH_TOKENS=0)
  FOLIO_CHUNK_GRAPH_DECODES=${SERVE_CHUNK_GRAPH_DECODES:-1} FOLIO_CHUNK_GRAPH_TOKENS=${SERVE_CHUNK_GRAPHS:-4096} \
    timeout 200 python3 -m folio serve --model $QWEN $COMMON \
    --served-model-name qwen3-0.6b --port $PORT > "$OUT/$p.log" 2>&1 &
  SERVER_PID=$!
  timeout 190 python3 -m folio bench serve --base-url http://127.0.0.1:$PORT --model qwen3-0.6b --workload random \
    --input-len ${SERVE_INPUT:-1000} --output-len ${SERVE_OUTPUT:-200} --num-prompts ${SERVE_PROMPTS:-300} \
    --request-rate ${SERVE_RATE:-20} --ready-timeout 120 --warmup-requests 1 --no-progress \
    --json "$OUT/$p-graphs${SERVE_CHUNK_GRAPHS:-4096}-d${SERVE_CHUNK_GRAPH_DECODES:-1}${SERVE_TAG:-}.json" 2>&1 | grep -E "duration|Output token|TTFT|ITL|Failed"
  kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; grep -E "Captured|ERROR|Traceback" "$OUT/$p.log" | cut -c1-200 | head -5 ;;
vs-vllm-serve-rate) part $p  # serve-rate's load on folio's server, then vLLM's OpenAI server, same folder and tokenizer
  # The config-only folder gains a synthetic tokenizer of the model's vocabulary (both servers detokenize).
  # vLLM's server imports modules its trimmed bundle lacks: VLLM_SERVER_WHEELS (a folder of wheels)
  # goes into its site; anything still missing gets an empty stand-in, named in the output. Session
  # 25's folder (16 MB): `pip download --no-deps --only-binary=:all: --python-version 3.12
  # --implementation cp --platform manylinux2014_x86_64 watchfiles prometheus_fastapi_instrumentator
  # model_hosting_container_standards jmespath supervisor mistral_common pydantic_extra_types
  # pycountry ijson` plus .whl's jsonschema, jsonschema_specifications, referencing and rpds_py.
  # With a vLLM part and .whl it passes a call's 64 MiB: carry it in the first part's call and
  # copy it to /tmp there (cp -r .vllm/extra /tmp/vllm-extra; VLLM_SERVER_WHEELS=/tmp/vllm-extra).
  # Session 26 ran it so (without supervisor, and pycountry in a call of its own: mistral_common
  # needs pycountry; with all of these no stand-in was needed).
  CKPT=/tmp/qwen3-0.6b-tok; mkdir -p $CKPT; cp $QWEN/config.json $CKPT/
  python3 -c "from folio.benchmarks.bench_tokenizer import build_bench_tokenizer as b; b(151936).save_pretrained('$CKPT')"
  [ -n "${VLLM_SERVER_WHEELS:-}" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/vsite \
    "$VLLM_SERVER_WHEELS"/*.whl 2>&1 | tail -2
  STUB=/tmp/vllm-stubs-server; rm -rf $STUB; mkdir -p $STUB  # this part's own: other parts never import them
  PYTHONPATH=/tmp/vsite:$STUB python3 - "$STUB" <<'PY'
import importlib, os, sys
stub = sys.argv[1]
for _ in range(60):
    importlib.invalidate_caches()
    try:
        importlib.import_module("vllm.entrypoints.openai.api_server")
        break
    except ModuleNotFoundError as e:
        if not e.name:
            raise
        folder = os.path.join(stub, *e.name.split("."))
        if e.name.split(".")[0] == "vllm" or os.path.exists(folder):
            raise
        print("vLLM server: stand-in for", e.name)
        parts = e.name.split(".")
        for i in range(1, len(parts) + 1):  # a package a level, so that dotted imports resolve
            os.makedirs(os.path.join(stub, *parts[:i]), exist_ok=True)
            init = os.path.join(stub, *parts[:i], "__init__.py")
            if not os.path.exists(init):
                with open(init, "w") as f:
                    f.write("__version__ = '0.0.0'\nclass _Stub(type):\n"  # a version: transformers parses it
                            "    def __getattr__(cls, name): return _Stub(name, (), {})\n"
                            "def __getattr__(name): return _Stub(name, (), {})\n")
else:
    print("vLLM server: still missing modules after 60 stand-ins")
PY
  PORT=18125
  for S in folio vllm; do  # folio first: a vLLM engine process that outlives its server cannot then hold the memory
    if [ $S = vllm ]; then
      PYTHONPATH=/tmp/vsite:$STUB VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 timeout 400 python3 -m \
        vllm.entrypoints.openai.api_server --model $CKPT --load-format dummy --dtype bfloat16 --max-model-len 4096 \
        --served-model-name qwen3-0.6b --port $PORT > "$OUT/$p-$S.log" 2>&1 &
    else
      timeout 150 python3 -m folio serve --model $CKPT $COMMON --served-model-name qwen3-0.6b --port $PORT \
        > "$OUT/$p-$S.log" 2>&1 &
    fi
    SERVER_PID=$!
    for i in $(seq 1 150); do  # up to 300 s for the server; stop at once if it died
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v1/models', timeout=2)" 2>/dev/null && break
      kill -0 $SERVER_PID 2>/dev/null || { echo "$S server exited"; break; }; sleep 2
    done
    kill -0 $SERVER_PID 2>/dev/null && timeout 390 python3 -m folio bench serve --base-url http://127.0.0.1:$PORT \
      --model qwen3-0.6b --workload random --input-len ${SERVE_INPUT:-1000} --output-len ${SERVE_OUTPUT:-200} \
      --num-prompts ${SERVE_PROMPTS:-300} --request-rate ${SERVE_RATE:-20} --ready-timeout 30 --warmup-requests 1 \
      --no-progress --json "$OUT/$p-$S.json" 2>&1 | grep -E "duration|Output token|TTFT|ITL|Failed"
    kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null
    grep -E "Error|Traceback" "$OUT/$p-$S.log" | cut -c1-200 | head -5
  done ;;
ingest) part ingest  # issue 11: W1's ramp on this host's CPU: the bench client alone, then the serve stack
  for C in asyncio httpx; do for M in null paused; do echo "client $C, $M:"
    timeout 100 python3 scripts/ingest_bench.py --mode $M --runs 7 --http-client $C --json "$OUT/ingest-$M-$C.json" 2>&1 | tail -1
  done; done ;;
prefix) part prefix
  timeout 150 python3 -m folio.benchmarks.prefix_caching --model $QWEN --load-format dummy --dtype bfloat16 \
    --num-prompts 256 --json "$OUT/prefix.json" 2>&1 | tail -25 ;;
peers-qwen) part peers-qwen
  timeout 560 python3 -m folio bench throughput --model $QWEN $COMMON --workload w1 --peer transformers \
    --peer-num-requests 128 --no-progress --json "$OUT/qwen3-0.6b-w1.json" 2> "$OUT/qwen3-0.6b-w1.log" | tail -40 ;;
peers-qwen-cb) part peers-qwen-cb  # transformers CB on the whole of W1 (DESIGN.md's 580 tok/s figure)
  timeout 580 python3 -m folio bench throughput --model $QWEN $COMMON --workload w1 --peer transformers \
    --peer-modes cb --no-progress --json "$OUT/qwen3-0.6b-w1-cb.json" 2> "$OUT/qwen3-0.6b-w1-cb.log" | tail -40 ;;
peers-qwen-generate) part peers-qwen-generate  # static generate on the whole of W1 (DESIGN.md: 527 tok/s)
  timeout 580 python3 -m folio bench throughput --model $QWEN $COMMON --workload w1 --peer transformers \
    --peer-modes generate --no-progress --json "$OUT/qwen3-0.6b-w1-generate.json" 2> "$OUT/qwen3-0.6b-w1-generate.log" | tail -40 ;;
peers-llama) part peers-llama
  timeout 560 python3 -m folio bench throughput --model $LLAMA $COMMON --workload w1 --peer transformers \
    --peer-num-requests 128 --no-progress --json "$OUT/llama-3.1-8b-w1.json" 2> "$OUT/llama-3.1-8b-w1.log" | tail -40 ;;
perf-tests) part perf-tests
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_prefill_attention.py \
    tests/kernels/test_gumbel_sample.py tests/kernels/test_triton_backend.py tests/kernels/test_paged_attention.py \
    tests/sample/test_sampler_gpu.py 2>&1 | tail -15 | tee "$OUT/perf-tests.txt" ;;
kernels-prefill) part kernels-prefill  # prefill kernel vs unified, and its tile sweep
  mkdir -p "$OUT/kprefill"; timeout 240 python3 -m folio.kernels.benchmark --only prefill --sweep \
    --out "$OUT/kprefill" 2>&1 | tail -56 ;;
prefill-gluon) part prefill-gluon  # issue 11: the Gluon prefill (loader + two consumers taking turns): GPU tests, kernel bench, TTFT Gluon vs Triton kernel on both models
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_prefill_attention_hopper.py 2>&1 | tail -3
  timeout 200 python3 -m folio.kernels.benchmark --only prefill 2>&1 | grep -E "chunk|prefill 8x" | tail -24
  for MK in $QWEN:triton $QWEN:gluon $QWEN:triton $QWEN:gluon $LLAMA:triton $LLAMA:gluon; do M=${MK%:*}; K=${MK#*:}
    FOLIO_PREFILL_KERNEL=$K timeout 150 python3 -m folio bench latency --model $M --load-format dummy --dtype bfloat16 \
      --prompt-lens 8192,30000 --batch-sizes "" 2>&1 | grep -E "^ttft" | sed "s/^/$K $(basename $M) /"
  done ;;
w1-tokenizer) part w1-tokenizer  # W1 Qwen3-0.6B with a 151,936-token tokenizer (detokenizing) vs without
  python3 -c "from folio.benchmarks.bench_tokenizer import build_bench_tokenizer as b; b(151936).save_pretrained('/tmp/bench-tok')"
  for TOK in "" "--tokenizer /tmp/bench-tok"; do
    timeout 200 python3 -m folio bench throughput --model $QWEN $COMMON --workload w1 $TOK --no-progress \
      --json "$OUT/w1-qwen3-0.6b${TOK:+-tokenizer}.json" 2>&1 | grep -E "^folio |wrote"
  done ;;
kernels-quant) part kernels-quant  # issue 13: W4A16 / FP8 GEMMs at the 8B's shapes, W4A16 small-M config sweep
  mkdir -p "$OUT/kquant"; timeout 400 python3 -m folio.kernels.benchmark --only quant --sweep --out "$OUT/kquant" 2>&1 | tail -120 ;;
kernels-fp8) part kernels-fp8  # issue 13: the FP8 GEMM by token count, cuBLASLt vs the Triton kernel, and the Triton config sweep
  mkdir -p "$OUT/kfp8"; timeout 420 python3 -m folio.kernels.benchmark --only fp8 ${FP8_SWEEP---sweep} --out "$OUT/kfp8" 2>&1 | tail -300 ;;
fp8-tests) part fp8-tests  # issue 13: the FP8 GEMMs (cuBLASLt and Triton) against the float32 reference at the 8B's shapes
  # the kernel files whole (their small-shape tests run on CUDA through the `device` fixture), the model file's GPU tests
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_kv_cache.py tests/kernels/test_pdl.py \
    tests/kernels/test_rms_norm.py tests/kernels/test_activation.py 2>&1 | tail -8 | tee "$OUT/fp8-tests.txt"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/test_quantized_vs_hf.py 2>&1 | tail -8 | tee -a "$OUT/fp8-tests.txt" ;;
kernels-quant-ab) part kernels-quant-ab  # issue 13: the quantized GEMMs at the 8B's shapes, default configs, exponent-bit unpack vs conversions
  mkdir -p "$OUT/kquant"; timeout 300 python3 -m folio.kernels.benchmark --only quant --out "$OUT/kquant" 2>&1 | tail -60 ;;
quant-decode) part quant-decode  # issue 13: batch-1 decode, bf16 / INT4 in QUANT_ROUNDS (default 5) alternating rounds (medians), then INT4 with other GEMV settings
  timeout 560 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 --schemes baseline,int4-rtn \
    --rounds ${QUANT_ROUNDS:-5} 2>&1 | grep -vE "INFO|it/s" | tail -6
  for V in ${QUANT_DECODE_VARIANTS:-columns in-step}; do  # columns: session 12-14's K step; in-step: chains without AHEAD
    case $V in columns) E="FOLIO_W4A16_GEMV_STEP=columns";; in-step) E='FOLIO_W4A16_GEMV_CONFIG={"AHEAD":0}';;
      *) E="FOLIO_W4A16_GEMV_CONFIG=$V";; esac
    echo "--- INT4 with $E"
    env "$E" timeout 150 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 \
      --schemes int4-rtn 2>&1 | grep -vE "INFO|it/s" | tail -4
  done ;;
latency-gap) part latency-gap  # issue 11: the 0.6B's batch-1 token, 1.24 ms on `bench latency` vs 0.95-0.98 on the quantization bench (session 16)
  for MML in 4096 30001; do
    timeout 150 python3 -m folio bench latency --model $QWEN --load-format dummy --dtype bfloat16 --prompt-lens "" \
      --batch-sizes 1 --max-model-len $MML 2>&1 | grep "decode batch 1" | sed "s/^/bench latency, max_model_len $MML: /"
    timeout 150 python3 -m folio.benchmarks.quantization decode --model $QWEN --dtype bfloat16 --schemes baseline \
      --max-model-len $MML --output-len 512 2>&1 | grep "^| baseline" | sed "s/^/quantization decode, 512 tokens, max_model_len $MML: /"
  done ;;
decode-profile) part decode-profile  # issue 13: device time per token by kernel, batch-1 decode of the 8B, bf16 and INT4
  timeout 300 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 --schemes baseline,int4-rtn \
    --kernel-profile 64 2>&1 | grep -vE "INFO|it/s" | tee "$OUT/decode-profile.txt" | tail -44 ;;
decode-splits) part decode-splits  # issues 11, 13: batch-1 decode with the split-KV decode's minimum split at 256 and 64 (default) tokens
  for T in ${DECODE_SPLIT_TOKENS:-256 64}; do
    echo "--- FOLIO_DECODE_MIN_SPLIT_TOKENS=$T"
    FOLIO_DECODE_MIN_SPLIT_TOKENS=$T timeout 200 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 \
      --schemes baseline,int4-rtn 2>&1 | grep -E "^\| (baseline|int4)"
    FOLIO_DECODE_MIN_SPLIT_TOKENS=$T timeout 120 python3 -m folio.benchmarks.quantization decode --model $QWEN --dtype bfloat16 \
      --schemes baseline 2>&1 | grep -E "^\| baseline" | sed 's/baseline/qwen3-0.6b bf16/'
  done ;;
pdl-ab) part pdl-ab  # issues 11, 13: batch-1 decode with programmatic dependent launch (the default on Hopper) and without
  for P in ${PDL_VALUES:-1 0}; do
    echo "--- FOLIO_PDL=$P"
    FOLIO_PDL=$P timeout 200 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 \
      --schemes ${PDL_SCHEMES:-baseline,int4-rtn} 2>&1 | grep -E "^\| (baseline|int4|fp8)"
    FOLIO_PDL=$P timeout 120 python3 -m folio.benchmarks.quantization decode --model $QWEN --dtype bfloat16 \
      --schemes baseline 2>&1 | grep -E "^\| baseline" | sed 's/baseline/qwen3-0.6b bf16/'
  done ;;
decode-ab) part decode-ab  # issues 11, 13: batch-1 decode of the 8B (bf16, INT4) under settings given as VAR=value[,VAR=value] words
  for V in ${DECODE_AB:-FOLIO_PDL=0 FOLIO_PDL=1 FOLIO_PDL=2}; do
    echo "--- $V"
    env ${V//,/ } timeout 200 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 \
      --schemes ${DECODE_AB_SCHEMES:-baseline,int4-rtn} 2>&1 | grep -E "^\| (baseline|int4|fp8)"
    [ -z "${DECODE_AB_QWEN:-}" ] || env ${V//,/ } timeout 120 python3 -m folio.benchmarks.quantization decode --model $QWEN \
      --dtype bfloat16 --schemes baseline 2>&1 | grep -E "^\| baseline" | sed 's/baseline/qwen3-0.6b bf16/'
  done ;;
pdl-tests) part pdl-tests  # the kernels that take PDL, on the GPU (eager, graph replay, the engine's CUDA graphs)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_w4a16_gemm.py \
    tests/kernels/test_paged_decode.py tests/kernels/test_rms_norm.py tests/kernels/test_activation.py \
    tests/kernels/test_qk_norm_rope.py tests/kernels/test_gemv.py tests/models/test_linear_seam.py tests/worker 2>&1 \
    | tail -15 | tee "$OUT/pdl-tests.txt" ;;
ncu-gemv) part ncu-gemv  # issue 13: Nsight Compute counters of the W4A16 GEMV (chains, then columns K steps) at the 8B's QKV shape
  timeout 300 ncu --clock-control none --kernel-name regex:_w4a16_gemv_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 scripts/gemv_once.py > "$OUT/ncu-gemv.txt" 2>&1; grep -E "Throughput|Occupancy|Stall|Duration|Registers|Waves" "$OUT/ncu-gemv.txt" | head -60 ;;
kernels-decode) part kernels-decode  # decode attention, bf16 and FP8 caches, against the copy roofline
  mkdir -p "$OUT/kdecode"; timeout 300 python3 -m folio.kernels.benchmark --only decode ${KDECODE_SWEEP:+--sweep} \
    --out "$OUT/kdecode" 2>&1 | tail -${KDECODE_LINES:-12} ;;
kernels-sampling) part kernels-sampling  # fused Gumbel-max draw vs the torch race
  mkdir -p "$OUT/ksample"; timeout 120 python3 -m folio.kernels.benchmark --only sampling --out "$OUT/ksample" 2>&1 | tail -14 ;;
latency-qwen|latency-llama|vs-vllm-latency-qwen|vs-vllm-latency-llama) part $p
  case $p in *qwen) M=$QWEN; N=qwen3-0.6b;; *) M=$LLAMA; N=llama-3.1-8b;; esac
  case $p in vs-*) PEER="--peer vllm";; *) PEER="";; esac
  timeout 560 python3 -m folio bench latency --model $M --load-format dummy --dtype bfloat16 $PEER \
    --json "$OUT/latency-$N${PEER:+-vs-vllm}.json" 2>&1 | grep -vE "INFO|it/s" | tail -12 ;;
short-ttft-qwen|short-ttft-llama|vs-vllm-short-qwen|vs-vllm-short-llama) part $p  # short prompts (chunk graphs, session 24)
  case $p in *qwen) M=$QWEN; N=qwen3-0.6b; L=300,1000,2000,4000;; *) M=$LLAMA; N=llama-3.1-8b; L=300,512,1000;; esac
  case $p in vs-*) PEER="--peer vllm";; *) PEER="";; esac
  timeout 400 python3 -m folio bench latency --model $M --load-format dummy --dtype bfloat16 $PEER --prompt-lens $L \
    --batch-sizes "" --repeat 7 --json "$OUT/short-ttft-$N${PEER:+-vs-vllm}.json" 2>&1 | grep -vE "INFO|it/s" | tail -8 ;;
vs-vllm-quant-llama) part $p  # issue 13: W1 on the 8B, bf16 then FP8 weights, each beside vLLM's own (QUANT_W1 picks)
  # The trimmed vLLM bundle lacks `humming`, which vLLM's quantization registry imports (session 23:
  # its FP8 run failed at start); FP8 never calls it, so an empty stand-in lets the import pass.
  STUB=/tmp/vllm-stubs-quant; rm -rf $STUB; mkdir -p $STUB/humming/utils
  for m in __init__ layer schema dtypes config utils/__init__ utils/weight; do printf '%s\n' \
    'class _Stub(type):' '    def __getattr__(cls, name): return _Stub(name, (), {})' \
    'def __getattr__(name): return _Stub(name, (), {})' > $STUB/humming/$m.py; done
  for Q in ${QUANT_W1:-bf16 fp8}; do
    PYTHONPATH=$PYTHONPATH:$STUB timeout 400 python3 -m folio bench throughput --model $LLAMA $COMMON --workload w1 \
      --temperature 0.6 $(quant_args $Q) --peer vllm --no-progress --json "$OUT/w1-llama-3.1-8b-$Q-vs-vllm.json" \
      2> "$OUT/w1-llama-$Q-vs-vllm.log" | tail -22
  done ;;
w1-qwen-t06|w1-qwen-greedy|w1-llama-t06|vs-vllm-qwen|vs-vllm-llama) part $p
  case $p in *llama*) M=$LLAMA; N=llama-3.1-8b;; *) M=$QWEN; N=qwen3-0.6b;; esac
  case $p in *greedy) TEMPS="0";; vs-vllm-qwen) TEMPS="0.6 0";; *) TEMPS="0.6";; esac
  case $p in vs-*) PEER="--peer vllm";; *) PEER="";; esac
  for T in $TEMPS; do
    timeout 280 python3 -m folio bench throughput --model $M $COMMON --workload w1 --temperature $T $PEER \
      --no-progress --json "$OUT/w1-$N-t$T${PEER:+-vs-vllm}.json" 2> "$OUT/w1-$N-t$T.log" | tail -22
  done ;;
wave-tests) part wave-tests  # issues 10, 13, 14, 15, 18 and the vLLM drop-in: every GPU test outside tests/kernels
  timeout 580 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 240 tests/structured_output tests/models --ignore tests/server/test_fuzz.py \
    tests/lora tests/spec_decode tests/server tests/compat tests/prefix tests/kernels/test_w4a16_gemm.py \
    tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_kv_cache.py tests/kernels/test_lora.py tests/kernels/test_lora_silu_and_mul.py \
    tests/kernels/test_qk_norm_rope.py 2>&1 | tail -40 | tee "$OUT/wave-tests.txt" ;;
structured) part structured  # issue 10: W1 with a JSON schema on every request vs unconstrained
  timeout 400 python3 -m folio bench throughput --structured json-schema --workload w1 --model $QWEN $COMMON \
    --no-progress --json "$OUT/structured-w1.json" 2>&1 | grep -vE "INFO|it/s" | tail -25 ;;
prefill-profile|vs-vllm-prefill-profile) part $p  # issue 11: device time by kernel of one long prompt's prefill (TTFT rows), folio or vLLM
  case $p in vs-*) ENGINE=vllm;; *) ENGINE=folio;; esac
  for C in ${PROFILE_CASES:-$QWEN:30000 $QWEN:8192 $LLAMA:30000 $LLAMA:8192}; do
    timeout 200 python3 scripts/prefill_profile.py --engine $ENGINE --model ${C%:*} --prompt-len ${C#*:} 2>&1 | grep -E "^PREFILL|Error"
  done ;;
w1-profile) part w1-profile  # issue 13: W1 on the 8B under torch.profiler, bf16 then FP8 (W1_PROFILE_QUANT), kernels by device time
  for Q in ${W1_PROFILE_QUANT:-none fp8}; do  # none, fp8, fp8-kv (FP8 weights and KV cache)
    timeout 240 python3 scripts/w1_offline.py --config llama-3.1-8b --modes async --profile-steps 0:100000 $(quant_args $Q) \
      --out "$OUT" 2>&1 | grep -E '"(output_tok_per_s|elapsed_s|steps|quantization)"'
  done ;;
quant-w1) part quant-w1  # issue 13: W1 on the 8B, bf16 then FP8 weights (QUANT_W1 picks: bf16 fp8 fp8-kv)
  quant_w1 ${QUANT_W1:-bf16 fp8} ;;
quant) part quant  # issue 13: FP8 W1 vs bf16 on the 8B, int4 batch-1 decode, FP8 KV blocks
  quant_w1 bf16 fp8 fp8-kv  # FP8 weights, then FP8 weights with the FP8 KV cache
  timeout 300 python3 -m folio.benchmarks.quantization decode --model $LLAMA --dtype bfloat16 2>&1 | grep -vE "INFO|it/s" | tail -12
  timeout 200 python3 -m folio.benchmarks.quantization kv-blocks --model $LLAMA --dtype bfloat16 --max-model-len 131072 2>&1 | grep -vE "INFO|it/s" | tail -8 ;;
spec-pair) part spec-pair  # issue 15: train the draft/target pair into /tmp/spec-pair (kept for the lease)
  [ -d /tmp/spec-pair/target ] || timeout 400 python3 -m folio.benchmarks.spec_decode_pair --out /tmp/spec-pair --device cuda --steps ${SPEC_STEPS:-1500} 2>&1 | grep -vE "it/s" | tail -6 ;;
spec) part spec  # issue 15: batch-1 draft and n-gram speedups, batch-64 cost
  timeout 400 python3 -m folio.benchmarks.spec_decode --target /tmp/spec-pair/target --draft /tmp/spec-pair/draft --k ${SPEC_K:-4 6 8} \
    2>&1 | grep --line-buffered -vE "INFO|it/s" | tee "$OUT/spec.txt" | tail -40 ;;
spec-timeline) part spec-timeline  # issue 15: GPU busy time of batch-1 steps without / with n-gram / with the draft
  PYTHONPATH=${SITE:-}. timeout 300 python3 scripts/profile_spec.py --target /tmp/spec-pair/target --draft /tmp/spec-pair/draft \
    --gpu-timeline 2>&1 | grep -E "^#####|^  " | tee "$OUT/spec-timeline.txt" ;;
spec-profile) part spec-profile  # issue 15: cProfile of batch-1 steps (host time by function, waits included)
  PYTHONPATH=${SITE:-}. timeout 300 python3 scripts/profile_spec.py --target /tmp/spec-pair/target --draft /tmp/spec-pair/draft \
    --top 40 2>&1 | grep -vE "INFO|it/s" > "$OUT/spec-profile.txt"; grep -E "^#####" "$OUT/spec-profile.txt" ;;
lora) part lora  # issue 14: base vs 1 adapter vs 8 adapters round-robin on W1, Llama-3.1-8B
  timeout 560 python3 scripts/bench_lora.py --config llama-3.1-8b --adapters 8 --rank 16 --abba --json "$OUT/lora-w1.json" \
    --modes ${LORA_MODES:-base,lora-none,lora-1,lora-N} ${LORA_UNSTACKED:+--unstacked} \
    ${LORA_PROFILE:+--profile $LORA_PROFILE} 2>&1 | grep --line-buffered -vE "INFO|it/s" > "$OUT/lora.txt"; grep -v "^  " "$OUT/lora.txt" | tail -12 ;;
dashboard) part dashboard  # issue 18: what the dashboard's polling costs W1 through HTTP
  PORT=18124
  timeout 300 python3 -m folio serve --model $QWEN --load-format dummy --dtype bfloat16 --port $PORT --disable-uvicorn-access-log > "$OUT/dashboard-serve.log" 2>&1 &
  SERVER_PID=$!
  timeout 280 python3 scripts/dashboard_cost.py --base-url http://127.0.0.1:$PORT --model $QWEN --rounds 3 2>&1 | tail -12
  kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null ;;
tp) part tp  # issue 17 on 2 GPUs: TP2 == TP1 (tests, 4-layer 8B checkpoint), batch-1 decode and W1 of the 8B at TP2, FP8 at TP2
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/parallel/test_tensor_parallel_gpu.py 2>&1 | tail -4
  timeout 200 python3 scripts/tp_bench.py equal --layers 4 --out "$OUT/tp-eq" 2>&1 | grep -vE "INFO|it/s" | tail -6
  timeout 150 python3 scripts/tp_bench.py decode --model $LLAMA --tp 2 --out "$OUT/tp-decode" 2>&1 | grep -vE "INFO|it/s" | tail -4
  timeout 150 python3 scripts/tp_bench.py w1 --model $LLAMA --tp 2 --out "$OUT/tp-w1" 2>&1 | grep -vE "INFO|it/s" | tail -4
  timeout 200 python3 -m folio bench throughput --model $LLAMA $COMMON --workload w1 --no-floor -tp 2 --quantization fp8 \
    --kv-cache-dtype fp8 --no-progress --json "$OUT/tp2-w1-fp8-kv.json" 2>&1 | grep -E "^folio  |Error|error" | tail -4 ;;
vllm-install) part vllm-install
  bash "${VLLM_PARTS:?carried folder with install.sh and the parts}/install.sh" "$VLLM_PARTS" "${VLLM_NPARTS:-3}" ;;
*) echo "unknown part $p"; exit 2 ;;
esac; done
echo "=== done $(date +%T)"
