#!/usr/bin/env bash
# Issue 11's before/after runs on one GPU, each part one A/B (new default vs the switch that
# restores the old path), written under $OUT:
#   bash scripts/issue11_ab.sh PART...   PART: ttft-qwen ttft-llama sampling-w1 batched-tokens-w1
#   decode-order-qwen decode-order-llama cudnn-ttft-qwen cudnn-ttft-llama
# The switches: FOLIO_PREFILL_ATTENTION=0 (unified kernel for prefill), FOLIO_FUSED_SAMPLING=0
# (torch race), --max-num-batched-tokens 8192 (the old default), FOLIO_DECODE_LONGEST_FIRST=0
# (decode programs in batch order; AB_ROUNDS alternating pairs), FOLIO_PREFILL_CUDNN=0 (long
# chunks on folio's Gluon kernel instead of cuDNN; AB_ROUNDS alternating pairs, TTFT rows only).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
[ -d /tmp/site ] && SITE=/tmp/site:  # the wheels gpu_session.sh installs
export PYTHONPATH=${SITE:-}. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
QWEN=folio/benchmarks/configs/qwen3-0.6b; LLAMA=folio/benchmarks/configs/llama-3.1-8b
W1="--load-format dummy --dtype bfloat16 --max-model-len 4096 --workload w1 --no-progress --no-floor"
lat() {  # lat NAME MODEL ENV... -- ARGS...
  local name=$1 model=$2; shift 2
  echo "=== $name $(date +%T)"
  env "$@" timeout 150 python3 -m folio bench latency --model $model --load-format dummy --dtype bfloat16 \
    ${LAT_ARGS:-} --json "$OUT/$name.json" 2>&1 | grep -vE "INFO|WARNING|it/s|^\('" | tail -6
}
w1() {  # w1 NAME ENV... -- ARGS
  local name=$1; shift
  echo "=== $name $(date +%T)"
  env $ENVS timeout 150 python3 -m folio bench throughput --model ${MODEL:-$QWEN} $W1 "$@" --json "$OUT/$name.json" \
    2> "$OUT/$name.log" | grep -E "^folio|output tok/s" | head -3
}
for p in "$@"; do case $p in
ttft-qwen) LAT_ARGS="--batch-sizes 1,64" lat ttft-qwen-new $QWEN FOLIO_PREFILL_ATTENTION=1
  LAT_ARGS="--batch-sizes 1" lat ttft-qwen-unified $QWEN FOLIO_PREFILL_ATTENTION=0 ;;
ttft-llama) LAT_ARGS="--batch-sizes 1" lat ttft-llama-new $LLAMA FOLIO_PREFILL_ATTENTION=1
  LAT_ARGS="--batch-sizes 1" lat ttft-llama-unified $LLAMA FOLIO_PREFILL_ATTENTION=0 ;;
sampling-w1) ENVS="FOLIO_FUSED_SAMPLING=1" w1 w1-qwen-t06-fused --temperature 0.6
  ENVS="FOLIO_FUSED_SAMPLING=0" w1 w1-qwen-t06-torch --temperature 0.6
  ENVS="FOLIO_FUSED_SAMPLING=1" w1 w1-qwen-greedy ;;
batched-tokens-w1) ENVS="FOLIO_FUSED_SAMPLING=1" w1 w1-qwen-greedy-8192 --max-num-batched-tokens 8192
  ENVS="FOLIO_FUSED_SAMPLING=1" w1 w1-qwen-greedy-16384 --max-num-batched-tokens 16384 ;;
decode-order-qwen|decode-order-llama)
  case $p in *qwen) M=$QWEN; N=qwen; T=0;; *) M=$LLAMA; N=llama; T=0.6;; esac
  for R in $(seq 1 ${AB_ROUNDS:-2}); do
    MODEL=$M ENVS="FOLIO_DECODE_LONGEST_FIRST=1" w1 w1-$N-t$T-longest-first-$R --temperature $T
    MODEL=$M ENVS="FOLIO_DECODE_LONGEST_FIRST=0" w1 w1-$N-t$T-batch-order-$R --temperature $T
  done ;;
cudnn-ttft-qwen|cudnn-ttft-llama)
  case $p in *qwen) M=$QWEN; N=qwen;; *) M=$LLAMA; N=llama;; esac
  for R in $(seq 1 ${AB_ROUNDS:-2}); do
    LAT_ARGS="--batch-sizes 1 --decode-steps 16 --repeat 5" lat ttft-$N-cudnn-$R $M FOLIO_PREFILL_CUDNN=1
    LAT_ARGS="--batch-sizes 1 --decode-steps 16 --repeat 5" lat ttft-$N-gluon-$R $M FOLIO_PREFILL_CUDNN=0
  done ;;
*) echo "unknown part $p"; exit 2 ;;
esac; done
echo "=== done $(date +%T)"
