#!/usr/bin/env bash
# kvferry against its references, in one run (issue 5; docs/BENCHMARKS.md). Run by `make bench`.
#   bench/compare.sh [BUILD_DIR [OUT_DIR]]      (defaults: build, out/bench)
# Measures, on this machine:
#   1. Google Benchmark micro-benchmarks of the hot pieces (BUILD/bench/kvferry_micro_*)
#   2. `kvferry bench` 1+1 over shm and tcp (Llama-3.1-8B, 4096 tokens/room, 64-token pages),
#      with BENCH_SHARDS transfer shards per rank and with 1
#   3. ucx_perftest ucp_put_bw over posix shm and tcp (and ucp_am_bw over tcp; the best tcp one
#      counts) at the size of kvferry's coalesced writes (`write_bytes` of step 2)
#   4. a single-thread memcpy over pool-sized buffers, the same write size, the same byte volume
#   5. a request-size sweep of 2-4 on both transports (bandwidth vs size; BENCHMARKS.md plots)
#   6. control plane: 1 page of 1 layer per room, max rate; then at a fixed rate a run and a 10x
#      longer one (per-room CPU, RssAnon of each rank after N and after 10N... rooms)
#   7. failure path: `kvferry replay` with per-room faults on 1+1 and 4+4 (fault -> every rank
#      Failed, p50/p99 from report.json faults[]), and a SIGKILLed prefill rank (detection ms)
#   8. layer-wise streaming: the same 1+1 shm run with a per-layer compute model, without and
#      with --layerwise (transfer tail after the last layer's compute)
# Raw results: OUT/*.json, OUT/*.csv; summary: OUT/summary.json. The LAST line printed is
#   shm_vs_ucx_perftest=R shm_vs_memcpy=R tcp_vs_ucx_perftest=R propagation_p99_ms=X peer_death_detect_ms=Y
#   layerwise_tail_ratio=R   (8.)
# Knobs (environment): BENCH_DURATION (s, default 8), SWEEP_DURATION (s, 4; twice that from 16384
# tokens/room on), CP_RATE (rooms/s, 2000), CP_SHORT (s, 5; the long run is 10x), SWEEP_TOKENS
# ("256 1024 4096 16384"), FAIL_REQUESTS (300), BENCH_SHARDS (transfer shards per rank of the
# bandwidth runs, 2).
set -euo pipefail

BUILD=${1:-build}
OUT=${2:-out/bench}
KV="$BUILD/kvferry"
PY=/usr/bin/python3
DUR=${BENCH_DURATION:-8}
SWEEP_DUR=${SWEEP_DURATION:-4}
SHARDS=${BENCH_SHARDS:-2}
CP_RATE=${CP_RATE:-2000}
CP_SHORT=${CP_SHORT:-5}
SWEEP_TOKENS=${SWEEP_TOKENS:-"256 1024 4096 16384"}
FAIL_REQUESTS=${FAIL_REQUESTS:-300}
MODEL=Llama-3.1-8B
PAGE=64
TOKENS=4096
CONC=4

for f in "$KV" "$BUILD/bench/kvferry_memcpy_bw"; do
  [ -x "$f" ] || { echo "compare.sh: $f missing (build first: make build)" >&2; exit 2; }
done
command -v ucx_perftest >/dev/null || { echo "compare.sh: ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 2; }
command -v jq >/dev/null || { echo "compare.sh: jq missing (make deps)" >&2; exit 2; }

mkdir -p "$OUT"
rm -rf "$OUT"/*.json "$OUT"/*.csv "$OUT"/work "$OUT"/replay
T0=$(date +%s)
step() { printf '\n== [%ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

# --- 1. micro-benchmarks ------------------------------------------------------------------------
step "micro-benchmarks (Google Benchmark)"
for exe in "$BUILD"/bench/kvferry_micro_*; do
  name=$(basename "$exe")
  "$exe" --benchmark_min_time=0.05 --benchmark_out="$OUT/micro_${name#kvferry_micro_}.json" \
    --benchmark_out_format=json 2>&1 | grep -v '^\*\*\*WARNING\|^Run on\|^CPU Caches\|^  L[0-9]\|^Load Average\|^[0-9-]*T[0-9:]*' || true
done

# --- 2. kvferry bench, shm and tcp ---------------------------------------------------------------
kv_bench() {  # OUT_NAME ARGS...
  local name=$1
  shift
  "$KV" bench --model "$MODEL" --out "$OUT/$name.json" --work-dir "$OUT/work/$name" "$@" ||
    echo "compare.sh: kvferry bench $name exited with $? (see above)" >&2
  [ -f "$OUT/$name.json" ] || { echo "compare.sh: kvferry bench $name wrote no result" >&2; exit 1; }
}
step "kvferry bench 1+1 shm and tcp, $TOKENS tokens/room, concurrency $CONC, $SHARDS and 1 transfer shards, ${DUR}s each"
# The headline runs use $SHARDS transfer shards per rank (a 1+1 pair leaves a core idle with one);
# the same runs with one shard are kept beside them (summary.json "one_shard").
for tr in shm tcp; do
  kv_bench "kvferry_$tr" --page-size "$PAGE" --tokens "$TOKENS" --concurrency "$CONC" --transport "$tr" \
    --duration "$DUR" --transfer-shards "$SHARDS"
  kv_bench "kvferry_${tr}_1shard" --page-size "$PAGE" --tokens "$TOKENS" --concurrency "$CONC" \
    --transport "$tr" --duration "$DUR" --transfer-shards 1
done
WRITE=$(jq .write_bytes "$OUT/kvferry_shm.json")

# --- 3. ucx_perftest ----------------------------------------------------------------------------
# Server and client on loopback, peer error handling (-e) as kvferry uses it; prints MB/s (10^6).
perftest() {  # TLS TEST SIZE ITERS
  local tls=$1 test=$2 size=$3 iters=$4 port=$((20000 + RANDOM % 20000)) bw=""
  local env=(UCX_TLS="$tls" UCX_POSIX_ERROR_HANDLING=y UCX_SYSV_ERROR_HANDLING=y)
  env "${env[@]}" timeout 60 ucx_perftest -p "$port" -e -t "$test" -s "$size" -n "$iters" -w 10 \
    >"$OUT/perftest_server.log" 2>&1 &
  local srv=$!
  for _ in 1 2 3 4 5; do
    sleep 0.3
    bw=$(env "${env[@]}" timeout 60 ucx_perftest 127.0.0.1 -p "$port" -e -t "$test" -s "$size" -n "$iters" -w 10 -f 2>/dev/null |
      awk '$1 ~ /^[0-9]+$/ && NF >= 8 { bw = $6 } END { print bw }') || true
    [ -n "$bw" ] && break
  done
  wait "$srv" 2>/dev/null || true
  [ -n "$bw" ] || { echo "compare.sh: ucx_perftest $tls $test $size failed" >&2; bw=0; }
  echo "$bw"
}
iters_for() {  # SIZE TOTAL_BYTES -> iterations
  local n=$(( $2 / $1 ))
  [ "$n" -lt 20 ] && n=20
  echo "$n"
}
step "ucx_perftest at kvferry's write size ($WRITE bytes)"
PT_POSIX=$(perftest posix,self ucp_put_bw "$WRITE" "$(iters_for "$WRITE" 4000000000)")
PT_TCP_PUT=$(perftest tcp,self ucp_put_bw "$WRITE" "$(iters_for "$WRITE" 1000000000)")
PT_TCP_AM=$(perftest tcp,self ucp_am_bw "$WRITE" "$(iters_for "$WRITE" 1000000000)")
echo "posix ucp_put_bw $PT_POSIX MB/s; tcp ucp_put_bw $PT_TCP_PUT MB/s; tcp ucp_am_bw $PT_TCP_AM MB/s"

# --- 4. memcpy ----------------------------------------------------------------------------------
step "single-thread memcpy, pool-sized buffers, write size $WRITE"
memcpy_bw() {  # BENCH_JSON -> memcpy JSON with the bench's pools, write size, volume (cap 4 GB)
  local j=$1
  local src dst w vol
  src=$(jq '[.ranks[] | select(.name | startswith("prefill")) | .pool_bytes] | max' "$j")
  dst=$(jq '[.ranks[] | select(.name | startswith("decode")) | .pool_bytes] | max' "$j")
  w=$(jq .write_bytes "$j")
  vol=$(jq '[.bytes, 4000000000] | min | if . < 1000000000 then 1000000000 else . end' "$j")
  "$BUILD/bench/kvferry_memcpy_bw" "$src" "$dst" "$w" "$vol" 3
}
memcpy_bw "$OUT/kvferry_shm.json" | tee "$OUT/memcpy.json"

# --- 5. request-size sweep ----------------------------------------------------------------------
step "request-size sweep: tokens/room $SWEEP_TOKENS on shm and tcp, ${SWEEP_DUR}s each (twice from 16384 on)"
echo "transport,tokens,write_bytes,kvferry_gb_per_s,ucx_perftest_gb_per_s,memcpy_gb_per_s,p50_ms,p99_ms" >"$OUT/bw_vs_size.csv"
for tok in $SWEEP_TOKENS; do
  conc=$CONC
  sdur=$SWEEP_DUR
  # 2 GiB rooms, 2 in flight: a batch can take seconds; twice the window so that rooms complete
  # inside it (latency columns) and more than one batch is averaged.
  [ "$tok" -ge 16384 ] && conc=2 && sdur=$(awk -v d="$SWEEP_DUR" 'BEGIN { print 2 * d }')
  for tr in shm tcp; do
    kv_bench "sweep_${tr}_${tok}" --page-size "$PAGE" --tokens "$tok" --concurrency "$conc" --transport "$tr" --duration "$sdur" --warmup 0.5 --transfer-shards "$SHARDS"
    j="$OUT/sweep_${tr}_${tok}.json"
    w=$(jq .write_bytes "$j")
    if [ "$tr" = shm ]; then
      pt=$(perftest posix,self ucp_put_bw "$w" "$(iters_for "$w" 2000000000)")
      mc=$(memcpy_bw "$j" | jq .median_gb_per_s)
    else
      pt=$(perftest tcp,self ucp_am_bw "$w" "$(iters_for "$w" 500000000)")
      mc=""
    fi
    echo "$tr,$tok,$w,$(jq .gb_per_s "$j"),$(awk -v x="$pt" 'BEGIN { print x / 1000 }'),$mc,$(jq .transfer_latency_ms.p50 "$j"),$(jq .transfer_latency_ms.p99 "$j")" >>"$OUT/bw_vs_size.csv"
  done
done
cat "$OUT/bw_vs_size.csv"

# --- 6. control plane ---------------------------------------------------------------------------
CP_ARGS=(--layers 1 --tokens 16 --page-size 16 --concurrency 16 --transport shm)
step "control plane: 1 page x 1 layer per room, 1+1 shm, max rate"
kv_bench cp_max "${CP_ARGS[@]}" --duration "$DUR"
CP_LONG=$(( CP_SHORT * 10 ))
CHECK=$(( CP_RATE * CP_SHORT / 5 ))
step "control plane at $CP_RATE rooms/s: ${CP_SHORT}s and ${CP_LONG}s (RssAnon checkpoint after $CHECK rooms)"
kv_bench cp_short "${CP_ARGS[@]}" --rate "$CP_RATE" --duration "$CP_SHORT" --warmup 1 --rss-checkpoint "$CHECK"
kv_bench cp_long "${CP_ARGS[@]}" --rate "$CP_RATE" --duration "$CP_LONG" --warmup 1 --rss-checkpoint "$CHECK"

# --- 7. failure path ----------------------------------------------------------------------------
mkdir -p "$OUT/replay"
awk -v n="$FAIL_REQUESTS" 'BEGIN { for (i = 0; i < n; i++)
  printf "{\"timestamp\": %d, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": []}\n", i * 10 }' \
  >"$OUT/replay/trace.jsonl"
FAIL_PLAN=transfer@prefill:0.05,transfer@decode:0.05,decode_fail:0.05,abort:0.05
replay() {  # NAME TP FAULTS TRANSPORT [MORE REPLAY OPTIONS]
  "$KV" replay --trace "$OUT/replay/trace.jsonl" --model "$MODEL" --prefill-tp "$2" --decode-tp "$2" \
    --pool-mib 256 --prefill-pool-mib 64 --page-size 16 --time-scale 1 --seed 1 --transport "$4" \
    --faults "$3" --out "$OUT/replay/$1" "${@:5}" | tail -8
}
step "failure propagation: per-room faults, 1+1 and 4+4 ($FAIL_REQUESTS requests each)"
replay tp1 1 "$FAIL_PLAN" shm --request-timeout-s 60 || true
replay tp4 4 "$FAIL_PLAN" shm --request-timeout-s 60 || true
step "peer death: SIGKILL of prefill/tp0 on 1+1 shm and tcp"
# 60 requests: the kill comes while rooms are in flight. Rooms dispatched right after the restart,
# before decode found the restarted rank again, used to stay unanswered until the router's request
# timeout (issue 3, fixed: decode waits for the source to register again); it stays short here so
# a regression shows as "router: no result within 20 s" instead of a long stall.
replay death_shm 1 peer_death@prefill/tp0:once shm --max-requests 60 --request-timeout-s 20 || true
replay death_tcp 1 peer_death@prefill/tp0:once tcp --max-requests 60 --request-timeout-s 20 || true

# --- layer-wise streaming (issue 15) -------------------------------------------------------------
# One pair with the same options, with and without --layerwise: 1+1 shm, Llama-3.1-8B, $TOKENS
# tokens/room, one room in flight, LW_MS_PER_LAYER (default 3) ms of simulated compute per layer:
# 32 layers take about as long as one room's transfer on this machine (docs/BENCHMARKS.md,
# "Layer-wise streaming"); a 2 s warm-up keeps the first rooms (2-3x slower in both modes)
# out of the window. summarize.py: layerwise_tail_ratio = p50 transfer tail with / without.
LW_MS=${LW_MS_PER_LAYER:-3}
step "layer-wise streaming: $LW_MS ms/layer of compute, 1+1 shm, $TOKENS tokens/room, without and with --layerwise"
kv_bench layerwise_off --page-size "$PAGE" --tokens "$TOKENS" --concurrency 1 --transport shm \
  --transfer-shards "$SHARDS" --duration "$DUR" --warmup 2 --prefill-ms-per-layer "$LW_MS"
kv_bench layerwise_on --page-size "$PAGE" --tokens "$TOKENS" --concurrency 1 --transport shm \
  --transfer-shards "$SHARDS" --duration "$DUR" --warmup 2 --prefill-ms-per-layer "$LW_MS" --layerwise

# --- summary ------------------------------------------------------------------------------------
step "summary"
"$PY" "$(dirname "$0")/summarize.py" "$OUT" "$PT_POSIX" "$PT_TCP_PUT" "$PT_TCP_AM"
