#!/bin/sh
# The liveness path under load (docs/testing.md, "Under load"): the same 2+2 replay (no faults, no
# kills, default liveness deadlines: heartbeat 100 ms / 800 ms, engine agreement 600 ms) idle, beside
# a CPU hog (one spinner per core, tests/hog/hog.sh), and beside the hog with the liveness threads
# left at nice 0 (KVFERRY_LIVENESS_NICE=0). From every rank's "liveness" log line (the peer
# monitor's own counts, src/endpoint/peer_monitor.h) and the report: gaps between frames from a
# peer (p50 = median over ranks, p99 and max = the worst rank), silences past the heartbeat
# timeout, how many of those the connect probe found alive, and false deaths (every peer_dead of a
# replay without kills, report.json unexplained_peer_dead: heartbeat and engine agreement alike).
#
#   bench/liveness.sh [BUILD] [OUT] [REQUESTS]     defaults: build out/liveness 300
set -eu
BUILD=${1:-build}
OUT=${2:-out/liveness}
N=${3:-300}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
TRACE=$OUT/trace.jsonl
# N requests 100 ms apart, 100-1200 tokens: about 1 room in flight per engine, all the time.
awk -v n="$N" 'BEGIN { split("100 300 600 1200", t, " "); for (i = 0; i < n; i++)
  printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 4, \"hash_ids\": [%d]}\n", i * 100, t[i % 4 + 1], i }' > "$TRACE"
run() {  # NAME HOG_CPUS LIVENESS_NICE
  rm -rf "$OUT/$1"
  HOG_CPUS=$2 KVFERRY_LIVENESS_NICE=$3 "$HERE/tests/hog/hog.sh" "$BUILD/kvferry" replay --trace "$TRACE" \
    --model Qwen2.5-7B --prefill-tp 2 --decode-tp 2 --pool-mib 256 --prefill-pool-mib 64 --page-size 16 \
    --time-scale 1 --transport shm --out "$OUT/$1" > "$OUT/$1.txt" 2>&1 || echo "$1: replay exited $? (see $OUT/$1.txt)"
}
run idle 0 -10
run hog "$(nproc)" -10
run hog-nice0 "$(nproc)" 0
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
print("%-10s %6s %8s %8s %8s %9s %12s %10s %12s" % ("run", "ranks", "p50 ms", "p99 ms", "max ms",
      "silences", "probe alive", "false dead", "stalls ms"))
for name in ("idle", "hog", "hog-nice0"):
    lines = []
    for f in glob.glob(f"{out}/{name}/logs/*.jsonl"):
        for l in open(f):
            o = json.loads(l)
            if o.get("event") == "liveness":
                lines.append(o)
    try:
        rep = json.load(open(f"{out}/{name}/report.json"))
        false_dead = len(rep.get("unexplained_peer_dead", []))
    except (OSError, ValueError):
        false_dead = "?"
    if not lines:
        print(f"{name:<10} no liveness lines"); continue
    g = lambda k: [float(o[k]) for o in lines]
    print("%-10s %6d %8.0f %8.0f %8.0f %9d %12d %10s %12.0f" % (name, len(lines), statistics.median(g("gap_p50_ms")),
          max(g("gap_p99_ms")), max(g("gap_max_ms")), sum(g("suspected")), sum(g("probed_alive")), false_dead,
          max(g("stalled_ms"))))
PY
