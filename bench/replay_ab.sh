#!/bin/bash
# Interleaved A/B of `kvferry replay` between two builds (docs/BENCHMARKS.md, "The replay's engine
# ranks through the public API"): each round runs every case with both binaries, alternating which
# goes first, and prints each run's GB/s and transfer latency.
# Usage: bench/replay_ab.sh NEW_KVFERRY OLD_KVFERRY OUT_DIR [ROUNDS] [CASES: shm tcp]
# Run from the repository root (the trace path is relative); the machine should be idle.
set -u
NEW=$1 OLD=$2 OUT=$3 ROUNDS=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
CASES=("$@"); [ ${#CASES[@]} = 0 ] && CASES=(shm tcp)
COMMON="--trace data/traces/conversation_trace.jsonl --model Llama-3.1-8B --prefill-tp 2 --decode-tp 2 --pool-mib 6656 --prefill-pool-mib 1024 --page-size 64 --time-scale 0 --fault-rate 0.02 --seed 1"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for name in "${CASES[@]}"; do
    case $name in
      shm) args="$COMMON --max-requests 200 --transport shm" ;;
      tcp) args="$COMMON --max-requests 100 --transport tcp" ;;
      *) echo "unknown case $name" >&2; exit 2 ;;
    esac
    order="new old"; [ $(( r % 2 )) = 0 ] && order="old new"
    for path in $order; do
      kv=$NEW; [ "$path" = old ] && kv=$OLD
      run="$OUT/${name}_${path}_r$r"
      timeout 600 "$kv" replay $args --out "$run" > "$run.txt" 2>&1
      echo "$name $path r$r rc=$? $(grep -o 'moved [0-9.]* GB in [0-9.]* s: [0-9.]* GB/s' "$run.txt") |" \
           "$(grep -o 'transfer latency p50 [0-9.]* ms, p99 [0-9.]* ms' "$run.txt")"
    done
  done
done
