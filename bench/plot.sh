#!/usr/bin/env bash
# PNG plots of a bench/compare.sh run (docs/BENCHMARKS.md), with gnuplot (Debian gnuplot-nox).
#   bench/plot.sh [OUT_DIR [FIG_DIR]]     (defaults: out/bench, docs/bench)
#   FIG_DIR/bw_vs_size.png   bandwidth vs write size: kvferry bench (shm, tcp), ucx_perftest
#                            (posix put, tcp am), single-thread memcpy; from OUT/bw_vs_size.csv
#   FIG_DIR/latency_cdf.png  CDF of transfer latency: 1+1 shm and tcp (4096 tokens/room) and the
#                            control-plane run (1 page x 1 layer); from OUT/latency_cdf_*.csv
set -euo pipefail
OUT=${1:-out/bench}
FIG=${2:-docs/bench}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot missing (make deps)" >&2; exit 2; }
for f in bw_vs_size.csv latency_cdf_shm.csv latency_cdf_tcp.csv latency_cdf_cp.csv; do
  [ -f "$OUT/$f" ] || { echo "plot.sh: $OUT/$f missing (run bench/compare.sh first)" >&2; exit 2; }
done
mkdir -p "$FIG"
# One file per transport for gnuplot (CSV columns: transport,tokens,write_bytes,kvferry,perftest,memcpy,p50,p99).
grep '^shm,' "$OUT/bw_vs_size.csv" >"$OUT/bw_shm.dat"
grep '^tcp,' "$OUT/bw_vs_size.csv" >"$OUT/bw_tcp.dat"
gnuplot <<GP
set terminal pngcairo size 900,560 font ",11"
set datafile separator ","
set output "$FIG/bw_vs_size.png"
set title "Bandwidth vs write size (1+1, Llama-3.1-8B, one room's chunk per write)"
set xlabel "coalesced write size (bytes)"
set ylabel "GB/s (10^9 B/s)"
set logscale x 2
set format x "%.0b %BB"
set key top left
set grid
plot "$OUT/bw_shm.dat" using 3:4 with linespoints lw 2 pt 7 title "kvferry bench shm", \
     "$OUT/bw_shm.dat" using 3:5 with linespoints lw 2 pt 5 title "ucx\\\\_perftest posix ucp\\\\_put\\\\_bw", \
     "$OUT/bw_shm.dat" using 3:6 with linespoints lw 2 pt 9 title "memcpy of the same pieces, as many threads as shards", \
     "$OUT/bw_tcp.dat" using 3:4 with linespoints lw 2 pt 7 dt 2 title "kvferry bench tcp", \
     "$OUT/bw_tcp.dat" using 3:5 with linespoints lw 2 pt 5 dt 2 title "ucx\\\\_perftest tcp ucp\\\\_am\\\\_bw"

set output "$FIG/latency_cdf.png"
set title "Transfer latency CDF (first send() to Success, 1+1)"
set xlabel "ms"
set ylabel "fraction of rooms"
set logscale x 10
set format x "%g"
unset logscale y
set yrange [0:1]
set key bottom right
plot "$OUT/latency_cdf_cp.csv" using 1:2 every ::1 with lines lw 2 title "control plane: 1 page x 1 layer (64 KiB), shm", \
     "$OUT/latency_cdf_shm.csv" using 1:2 every ::1 with lines lw 2 title "4096 tokens (512 MiB), shm, 4 in flight", \
     "$OUT/latency_cdf_tcp.csv" using 1:2 every ::1 with lines lw 2 title "4096 tokens (512 MiB), tcp, 4 in flight"
GP
echo "plots: $FIG/bw_vs_size.png $FIG/latency_cdf.png"
