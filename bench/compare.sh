#!/usr/bin/env bash
# kvferry against its references, in one run (issue 5; docs/BENCHMARKS.md). Run by `make bench`.
#   bench/compare.sh [BUILD_DIR [OUT_DIR]]      (defaults: build, out/bench)
# Measures, on this machine:
#   1. Google Benchmark micro-benchmarks of the hot pieces (BUILD/bench/kvferry_micro_*), and
#      1-page rooms at concurrency 1 through the SGLang backend (bench/sglang_room_latency.py)
#   2. ROUNDS interleaved rounds (A B A B: the machine's drift hits every contender alike), each:
#      `kvferry bench` 1+1 over shm (Llama-3.1-8B, 4096 tokens/room, 64-token pages, BENCH_SHARDS
#      transfer shards), the memcpy of the same pieces with as many threads (bench/memcpy_bw.cc),
#      ucx_perftest ucp_put_bw over posix shm at kvferry's write size, `kvferry bench` over tcp,
#      ucx_perftest ucp_am_bw (default window and kvferry's writes per batch outstanding) and
#      ucp_put_bw over tcp; then the same kvferry runs with 1 shard
#   3. fragmented transfers: random page order at page sizes FRAG_PAGES and unequal TP FRAG_TP,
#      each beside the memcpy of the same pieces and ucx_perftest put at that size
#   4. a request-size sweep of 2 on both transports (bandwidth vs size; BENCHMARKS.md plots)
#   5. control plane: 1 page of 1 layer per room, max rate; then at a fixed rate a run and a 10x
#      longer one (per-room CPU, RssAnon of each rank after N and after 10N... rooms)
#   6. failure path: `kvferry replay` with per-room faults on 1+1 and 4+4 (fault -> every rank
#      Failed, p50/p99 from report.json faults[]), and a SIGKILLed prefill rank (detection ms)
#   1b. a 4096-token room at concurrency 1 through the vLLM connector (bench/vllm_room_gbps.py)
#      and `kvferry bench` (same geometry, 16-token pages; on its pool and --memory engine), tcp and shm
#   8. layer-wise streaming: the same 1+1 shm run with a per-layer compute model, without and
#      with --layerwise (transfer tail after the last layer's compute)
# Raw results: OUT/*.json, OUT/*.csv; summary: OUT/summary.json. The LAST line printed is
#   shm_vs_memcpy=R shm_vs_ucx_perftest=R tcp_vs_ucx_perftest=R frag_4k_vs_memcpy=R faults_per_gb=X
#   layerwise_tail_ratio=R propagation_p99_ms=X peer_death_detect_ms=Y
# Knobs (environment): BENCH_ROUNDS (3), BENCH_DURATION (s, default 8), SWEEP_DURATION (s, 4; twice
# that from 16384 tokens/room on), CP_RATE (rooms/s, 2000), CP_SHORT (s, 5; the long run is 10x),
# SWEEP_TOKENS ("256 1024 4096 16384"), FAIL_REQUESTS (1000: ~220 faults, so the p99 is not just the maximum), BENCH_SHARDS (transfer shards per rank
# of the bandwidth runs, 2), FRAG_DURATION (s, 4), FRAG_PAGES ("1 2 16 64"), FRAG_TP ("2:1 1:2 4:2").
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
FAIL_REQUESTS=${FAIL_REQUESTS:-1000}
ROUNDS=${BENCH_ROUNDS:-3}
FRAG_DUR=${FRAG_DURATION:-4}
FRAG_PAGES=${FRAG_PAGES:-"1 2 16 64"}
FRAG_TP=${FRAG_TP:-"2:1 1:2 4:2"}
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
# One-page rooms through the SGLang backend (issue 30 item 4): the C++ API's are the micro-benchmark
# kvferry_micro_room_latency above; summarize.py prints both.
step "one-page rooms through kvferry.sglang, concurrency 1, tcp and shm"
for tr in tcp shm; do
  PYTHONPATH="$BUILD/python" "$PY" "$(dirname "$0")/sglang_room_latency.py" --transport "$tr" \
    --json "$OUT/sglang_room_latency_$tr.json" || echo "compare.sh: sglang_room_latency.py $tr failed" >&2
done

# --- 2-4. interleaved rounds: kvferry against its references ---------------------------------------
kv_bench() {  # OUT_NAME ARGS...
  local name=$1
  shift
  "$KV" bench --model "$MODEL" --out "$OUT/$name.json" --work-dir "$OUT/work/$name" "$@" ||
    echo "compare.sh: kvferry bench $name exited with $? (see above)" >&2
  [ -f "$OUT/$name.json" ] || { echo "compare.sh: kvferry bench $name wrote no result" >&2; exit 1; }
}
# A 4096-token room of Llama-3.1-8B (block size 16: 512 MiB) at concurrency 1, through the vLLM
# connector (bench/vllm_room_gbps.py: fake-vLLM prefill and decode engines as processes) and
# through the C++ API (`kvferry bench`, 16-token pages, 1 transfer shard as the connector's
# default), on kvferry's pool and on engine buffers (--memory engine: one buffer per layer tensor,
# vLLM's kind of memory; docs/vllm.md "Throughput"); summarize.py prints them (issue 33, 33c).
step "4096-token rooms, concurrency 1: kvferry.vllm and the C++ API, tcp and shm"
for tr in tcp shm; do
  kv_bench "room4096_cpp_$tr" --tokens "$TOKENS" --page-size 16 --concurrency 1 --transport "$tr" \
    --duration "$DUR"
  kv_bench "room4096_cpp_engine_$tr" --tokens "$TOKENS" --page-size 16 --concurrency 1 --transport "$tr" \
    --duration "$DUR" --memory engine
  PYTHONPATH="$BUILD/python" "$PY" "$(dirname "$0")/vllm_room_gbps.py" --transport "$tr" \
    --json "$OUT/vllm_room_gbps_$tr.json" || echo "compare.sh: vllm_room_gbps.py $tr failed" >&2
done
# Server and client on loopback, peer error handling (-e) as kvferry uses it; prints MB/s (10^6).
perftest() {  # TLS TEST SIZE ITERS [OUTSTANDING]
  local tls=$1 test=$2 size=$3 iters=$4 outstanding=${5:-0} port=$((20000 + RANDOM % 20000)) bw=""
  local env=(UCX_TLS="$tls" UCX_POSIX_ERROR_HANDLING=y UCX_SYSV_ERROR_HANDLING=y)
  env "${env[@]}" timeout 60 ucx_perftest -p "$port" -e -t "$test" -s "$size" -n "$iters" -w 10 -O "$outstanding" \
    >"$OUT/perftest_server.log" 2>&1 &
  local srv=$!
  for _ in 1 2 3 4 5; do
    sleep 0.3
    bw=$(env "${env[@]}" timeout 60 ucx_perftest 127.0.0.1 -p "$port" -e -t "$test" -s "$size" -n "$iters" -w 10 \
      -O "$outstanding" -f 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 8 { bw = $6 } END { print bw }') || true
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
# The memcpy of the same pieces (bench/memcpy_bw.cc): the bench's pool sizes, piece (write) size,
# KV buffers, pieces per room and buffer, page order, and as many threads as the prefill ranks'
# transfer shards together (the threads that copy in kvferry over shm). Volume: the bytes the bench
# moved in its window, 1-4 GB.
memcpy_same() {  # BENCH_JSON
  local j=$1
  "$BUILD/bench/kvferry_memcpy_bw" \
    --src-bytes "$(jq '[.ranks[] | select(.name | startswith("prefill")) | .pool_bytes] | max' "$j")" \
    --dst-bytes "$(jq '[.ranks[] | select(.name | startswith("decode")) | .pool_bytes] | max' "$j")" \
    --piece "$(jq .write_bytes "$j")" --buffers "$(jq '.buffers // 1' "$j")" \
    --room-pages "$(jq '.pieces_per_room_buffer // 1' "$j")" \
    --threads "$(jq '.config.transfer_shards * .config.prefill_tp' "$j")" \
    --order "$(jq -r '.config.page_order // "sequential"' "$j")" \
    --volume "$(jq '[.bytes, 4000000000] | min | if . < 1000000000 then 1000000000 else . end' "$j")"
}
# Rounds A B A B...: each round runs every contender once, back to back, so the machine's drift
# (this VM's memory bandwidth moves over minutes) hits them alike; summarize.py reports the median
# ratio and its spread over the rounds. ucx_perftest runs at kvferry's write size with its default
# outstanding window and with OUTSTANDING = the writes kvferry posts per batch (one per KV buffer);
# the best op of all counts.
step "$ROUNDS interleaved rounds: kvferry bench 1+1 shm and tcp ($TOKENS tokens/room, concurrency $CONC, $SHARDS shards, ${DUR}s), memcpy of the same pieces, ucx_perftest"
echo "round,contender,gb_per_s" >"$OUT/rounds.csv"
for r in $(seq 1 "$ROUNDS"); do
  kv_bench "kvferry_shm_r$r" --page-size "$PAGE" --tokens "$TOKENS" --concurrency "$CONC" --transport shm \
    --duration "$DUR" --transfer-shards "$SHARDS"
  WRITE=$(jq .write_bytes "$OUT/kvferry_shm_r$r.json")
  OUTSTANDING=$(jq .buffers "$OUT/kvferry_shm_r$r.json")
  memcpy_same "$OUT/kvferry_shm_r$r.json" >"$OUT/memcpy_r$r.json"
  pt_posix=$(perftest posix,self ucp_put_bw "$WRITE" "$(iters_for "$WRITE" 4000000000)")
  kv_bench "kvferry_tcp_r$r" --page-size "$PAGE" --tokens "$TOKENS" --concurrency "$CONC" --transport tcp \
    --duration "$DUR" --transfer-shards "$SHARDS"
  pt_am=$(perftest tcp,self ucp_am_bw "$WRITE" "$(iters_for "$WRITE" 1000000000)")
  pt_am_o=$(perftest tcp,self ucp_am_bw "$WRITE" "$(iters_for "$WRITE" 1000000000)" "$OUTSTANDING")
  pt_put=$(perftest tcp,self ucp_put_bw "$WRITE" "$(iters_for "$WRITE" 1000000000)")
  {
    echo "$r,kvferry_shm,$(jq .gb_per_s "$OUT/kvferry_shm_r$r.json")"
    echo "$r,memcpy,$(jq .median_gb_per_s "$OUT/memcpy_r$r.json")"
    echo "$r,perftest_posix_put,$(awk -v x="$pt_posix" 'BEGIN { print x / 1000 }')"
    echo "$r,kvferry_tcp,$(jq .gb_per_s "$OUT/kvferry_tcp_r$r.json")"
    echo "$r,perftest_tcp_am,$(awk -v x="$pt_am" 'BEGIN { print x / 1000 }')"
    echo "$r,perftest_tcp_am_outstanding,$(awk -v x="$pt_am_o" 'BEGIN { print x / 1000 }')"
    echo "$r,perftest_tcp_put,$(awk -v x="$pt_put" 'BEGIN { print x / 1000 }')"
  } >>"$OUT/rounds.csv"
done
cat "$OUT/rounds.csv"
# Round 1's runs stand for the headline figures of the plots and tables (latency CDFs).
cp "$OUT/kvferry_shm_r1.json" "$OUT/kvferry_shm.json"
cp "$OUT/kvferry_tcp_r1.json" "$OUT/kvferry_tcp.json"
cp "$OUT/memcpy_r1.json" "$OUT/memcpy.json"
step "kvferry bench 1+1 shm and tcp with 1 transfer shard, ${DUR}s each"
for tr in shm tcp; do
  kv_bench "kvferry_${tr}_1shard" --page-size "$PAGE" --tokens "$TOKENS" --concurrency "$CONC" \
    --transport "$tr" --duration "$DUR" --transfer-shards 1
done

# --- 4b. fragmented transfers -------------------------------------------------------------------
# Scattered page lists (both sides' pages in random order: one write per page per KV buffer) at
# page sizes of 1, 2 (4 KiB pieces for Llama-3.1-8B: frag_4k), 16 and 64 tokens, and unequal TP
# (each token's head slice its own write), over shm; each beside the memcpy of the same pieces and
# ucx_perftest posix put at that size with many writes outstanding (docs/BENCHMARKS.md).
step "fragmented transfers: random page order at page sizes $FRAG_PAGES; unequal TP $FRAG_TP; ${FRAG_DUR}s each"
echo "case,page_size,prefill_tp,decode_tp,write_bytes,kvferry_gb_per_s,writes_per_s,cpu_ns_per_write,memcpy_gb_per_s,ucx_perftest_gb_per_s" >"$OUT/frag.csv"
frag_case() {  # NAME PAGE PTP DTP ORDER
  local name=$1 page=$2 ptp=$3 dtp=$4 order=$5
  kv_bench "$name" --page-size "$page" --tokens "$TOKENS" --concurrency "$CONC" --transport shm \
    --duration "$FRAG_DUR" --warmup 0.5 --transfer-shards "$SHARDS" --prefill-tp "$ptp" --decode-tp "$dtp" \
    --page-order "$order"
  local j="$OUT/$name.json" w mc pt
  w=$(jq .write_bytes "$j")
  mc=$(memcpy_same "$j" | tee "$OUT/memcpy_$name.json" | jq .median_gb_per_s)
  pt=$(perftest posix,self ucp_put_bw "$w" "$(iters_for "$w" 1000000000)" 256)
  echo "$name,$page,$ptp,$dtp,$w,$(jq .gb_per_s "$j"),$(jq .writes_per_s "$j"),$(jq .cpu_ns_per_write "$j"),$mc,$(awk -v x="$pt" 'BEGIN { print x / 1000 }')" >>"$OUT/frag.csv"
}
for page in $FRAG_PAGES; do frag_case "frag_p$page" "$page" 1 1 random; done
for tps in $FRAG_TP; do frag_case "frag_tp${tps/:/to}" "$PAGE" "${tps%%:*}" "${tps##*:}" sequential; done
cat "$OUT/frag.csv"

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
      mc=$(memcpy_same "$j" | jq .median_gb_per_s)
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
"$PY" "$(dirname "$0")/summarize.py" "$OUT"
