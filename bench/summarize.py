#!/usr/bin/python3
"""Summary of one bench/compare.sh run: reads OUT/*.json and OUT/replay/*/report.json, writes
OUT/rounds.csv and OUT/frag.csv, writes OUT/summary.json and OUT/latency_cdf_*.csv (for
bench/plot.sh), prints the tables and, last, the line `shm_vs_memcpy=R shm_vs_ucx_perftest=R
tcp_vs_ucx_perftest=R frag_4k_vs_memcpy=R faults_per_gb=X layerwise_tail_ratio=R
propagation_p99_ms=X peer_death_detect_ms=Y` (ratios: the median over the interleaved rounds).

usage: summarize.py OUT
"""
import json
import math
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def nearest_rank(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[max(1, math.ceil(q * len(v))) - 1]


def write_cdf(path, points):
    with open(path, "w") as f:
        f.write("ms,fraction\n")
        n = len(points)
        for i, ms in enumerate(points):
            f.write(f"{ms},{(i + 1) / n if n else 0}\n")


def read_csv(path):
    try:
        with open(path) as f:
            lines = [l.strip().split(",") for l in f if l.strip()]
    except OSError:
        return []
    head = lines[0] if lines else []
    return [dict(zip(head, row)) for row in lines[1:]]


def spread(values):
    """median, min, max of a list of ratios (NaN for none)."""
    v = sorted(x for x in values if x == x)
    if not v:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "rounds": []}
    return {"median": v[(len(v) - 1) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2,
            "min": v[0], "max": v[-1], "rounds": values}


def main():
    out = sys.argv[1]
    ratio = lambda a, b: a / b if b > 0 else float("nan")
    # Interleaved rounds (compare.sh): per round every contender's GB/s.
    rounds = {}
    for row in read_csv(os.path.join(out, "rounds.csv")):
        rounds.setdefault(int(row["round"]), {})[row["contender"]] = float(row["gb_per_s"] or 0)
    per_round = []
    faults = []
    for r in sorted(rounds):
        g = rounds[r]
        best_tcp = max(g.get("perftest_tcp_am", 0), g.get("perftest_tcp_am_outstanding", 0), g.get("perftest_tcp_put", 0))
        per_round.append({"round": r, **g,
                          "shm_vs_memcpy": ratio(g.get("kvferry_shm", 0), g.get("memcpy", 0)),
                          "shm_vs_ucx_perftest": ratio(g.get("kvferry_shm", 0), g.get("perftest_posix_put", 0)),
                          "tcp_vs_ucx_perftest": ratio(g.get("kvferry_tcp", 0), best_tcp)})
        for tr in ("shm", "tcp"):
            try:
                rj = load(os.path.join(out, f"kvferry_{tr}_r{r}.json"))
            except OSError:
                continue
            faults.append((tr, rj.get("faults_per_gb", float("nan"))))
            # The round's stalls, next to its ratio: a room's transfer latency p99 and max.
            lat = rj.get("transfer_latency_ms", {})
            per_round[-1][f"{tr}_p99_ms"] = lat.get("p99", float("nan"))
            per_round[-1][f"{tr}_max_ms"] = lat.get("max", float("nan"))
    shm = load(os.path.join(out, "kvferry_shm.json"))
    tcp = load(os.path.join(out, "kvferry_tcp.json"))
    memcpy = load(os.path.join(out, "memcpy.json"))
    cp_max = load(os.path.join(out, "cp_max.json"))
    cp_short = load(os.path.join(out, "cp_short.json"))
    cp_long = load(os.path.join(out, "cp_long.json"))
    med = lambda key: statistics.median([x[key] for x in per_round]) if per_round else float("nan")
    s = {
        "rounds": per_round,
        "kvferry_shm_gb_per_s": med("kvferry_shm"),
        "kvferry_tcp_gb_per_s": med("kvferry_tcp"),
        "write_bytes": shm["write_bytes"],
        "ucx_perftest_posix_put_gb_per_s": med("perftest_posix_put"),
        "ucx_perftest_tcp_put_gb_per_s": med("perftest_tcp_put"),
        "ucx_perftest_tcp_am_gb_per_s": med("perftest_tcp_am"),
        "ucx_perftest_tcp_am_outstanding_gb_per_s": med("perftest_tcp_am_outstanding"),
        "memcpy_gb_per_s": med("memcpy"),
        "memcpy_threads": memcpy.get("threads", 1),
        "shm_vs_ucx_perftest": spread([x["shm_vs_ucx_perftest"] for x in per_round]),
        "shm_vs_memcpy": spread([x["shm_vs_memcpy"] for x in per_round]),
        "tcp_vs_ucx_perftest": spread([x["tcp_vs_ucx_perftest"] for x in per_round]),
        # The worst rank of any shm round (the copy runs in the prefill rank, into pages it maps);
        # tcp apart: its few faults a window (allocator growth in UCX and ZeroMQ) over a third of
        # the bytes.
        "faults_per_gb": max((f for tr, f in faults if tr == "shm"), default=float("nan")),
        "faults_per_gb_tcp": max((f for tr, f in faults if tr == "tcp"), default=float("nan")),
        "cpu_s_per_gb": {"shm": shm["cpu_s_per_gb"], "tcp": tcp["cpu_s_per_gb"]},
        "latency_ms": {"shm": shm["transfer_latency_ms"], "tcp": tcp["transfer_latency_ms"]},
        "transfer_shards": shm["config"].get("transfer_shards", 1),
    }
    # Fragmented transfers (compare.sh frag.csv): kvferry vs the memcpy of the same pieces.
    frag = []
    for row in read_csv(os.path.join(out, "frag.csv")):
        kv, mc = float(row["kvferry_gb_per_s"] or 0), float(row["memcpy_gb_per_s"] or 0)
        frag.append({**row, "vs_memcpy": ratio(kv, mc),
                     "vs_ucx_perftest": ratio(kv, float(row["ucx_perftest_gb_per_s"] or 0))})
    s["fragmented"] = frag
    s["frag_4k_vs_memcpy"] = next((f["vs_memcpy"] for f in frag if f["case"] == "frag_p2"), float("nan"))
    # The same runs with one transfer shard per rank (absent in runs from before the shards).
    one = {}
    for tr in ("shm", "tcp"):
        try:
            j = load(os.path.join(out, f"kvferry_{tr}_1shard.json"))
        except OSError:
            continue
        one[tr] = {"gb_per_s": j["gb_per_s"], "cpu_s_per_gb": j["cpu_s_per_gb"]}
    if one:
        s["one_shard"] = one
    # Control plane.
    rss = []
    for r in cp_long["ranks"]:
        rss.append({"rank": r["name"], "rooms_at_checkpoint": cp_long["config"]["rss_checkpoint"],
                    "anon_kib_at_checkpoint": r.get("rss_checkpoint", {}).get("anon_kib"),
                    "rooms_at_end": r["rooms_total"], "anon_kib_at_end": r["rss_end"]["anon_kib"]})
    s["control_plane"] = {
        "max_rooms_per_s": cp_max["rooms_per_s"],
        "max_rate_latency_ms": cp_max["transfer_latency_ms"],
        "rate": cp_short["config"]["rate"],
        "short": {"duration_s": cp_short["window_s"], "rooms": cp_short["rooms"],
                  "cpu_us_per_room": cp_short["cpu_us_per_room"]},
        "long": {"duration_s": cp_long["window_s"], "rooms": cp_long["rooms"],
                 "cpu_us_per_room": cp_long["cpu_us_per_room"]},
        "rss": rss,
    }
    # Failure path.
    fails = {}
    def report(name):  # a replay that stopped early has no faults / peer_deaths: NaN below
        try:
            return load(os.path.join(out, "replay", name, "report.json"))
        except (OSError, ValueError):
            print(f"summarize.py: no report for replay {name}", file=sys.stderr)
            return {"faults": [], "peer_deaths": [], "faults_summary": {"attributed": 0, "by_kind": {}}}

    for name in ("tp1", "tp4"):
        rep = report(name)
        t = [f["time_to_all_failed_ms"] for f in rep.get("faults", []) if f.get("applied", True)]
        fails[name] = {"faults": len(t), "attributed": rep.get("faults_summary", {}).get("attributed", 0),
                       "p50_ms": nearest_rank(t, 0.5), "p99_ms": nearest_rank(t, 0.99),
                       "max_ms": max(t) if t else float("nan"),
                       "by_kind": {k: v["time_to_all_failed_ms"] for k, v in rep.get("faults_summary", {}).get("by_kind", {}).items()}}
    deaths = {}
    for name in ("death_shm", "death_tcp"):
        rep = report(name)
        det = [d["ms"] for pd in rep.get("peer_deaths", []) for d in pd.get("detections", [])]
        deaths[name] = {"detections_ms": det, "max_ms": max(det) if det else float("nan")}
    s["failure"] = fails
    s["peer_death"] = deaths
    s["propagation_p99_ms"] = fails["tp4"]["p99_ms"]
    s["peer_death_detect_ms"] = max(d["max_ms"] for d in deaths.values())
    # --- layer-wise streaming (issue 15): transfer tail (last layer's compute -> decode Success),
    # p50/p99 with and without --layerwise; layerwise_tail_ratio = p50 with / p50 without.
    try:
        lw = {k: load(os.path.join(out, f"layerwise_{k}.json")) for k in ("off", "on")}
        s["layerwise"] = {"ms_per_layer": lw["on"]["config"]["prefill_ms_per_layer"],
                          "tail_ms": {k: j["transfer_tail_ms"] for k, j in lw.items()},
                          "rooms_per_s": {k: j["rooms_per_s"] for k, j in lw.items()}}
        s["layerwise_tail_ratio"] = ratio(lw["on"]["transfer_tail_ms"]["p50"], lw["off"]["transfer_tail_ms"]["p50"])
    except (OSError, KeyError, ValueError):
        print("summarize.py: no layer-wise pair (layerwise_off/on.json)", file=sys.stderr)
        s["layerwise_tail_ratio"] = float("nan")
    # One-page rooms at concurrency 1 (issue 30 item 4): the C++ API (micro_room_latency.json,
    # Google Benchmark counters) and the SGLang backend (sglang_room_latency_*.json), p50 in us.
    rooms = {}
    try:
        for b in load(os.path.join(out, "micro_room_latency.json")).get("benchmarks", []):
            tr = b["name"].split("/")[1]
            rooms[f"cpp_{tr}"] = {k: b[k] for k in ("p50_us", "p90_us", "p99_us", "max_us") if k in b}
    except (OSError, ValueError, KeyError, IndexError):
        print("summarize.py: no micro_room_latency.json", file=sys.stderr)
    for tr in ("tcp", "shm"):
        try:
            j = load(os.path.join(out, f"sglang_room_latency_{tr}.json"))
            rooms[f"sglang_{tr}"] = {k: j[k] for k in ("p50_us", "p90_us", "p99_us", "max_us")}
        except (OSError, ValueError, KeyError):
            print(f"summarize.py: no sglang_room_latency_{tr}.json", file=sys.stderr)
    s["one_page_room_us"] = rooms
    # A 4096-token room at concurrency 1 (issue 33): the C++ API (room4096_cpp_*.json, kvferry
    # bench) and the vLLM connector (vllm_room_gbps_*.json), GB/s.
    big = {}
    for tr in ("tcp", "shm"):
        for mem in ("", "engine_"):  # kvferry's pool; engine buffers (--memory engine, vLLM's memory)
            try:
                j = load(os.path.join(out, f"room4096_cpp_{mem}{tr}.json"))
                # the window's GB/s, and one room's bytes over decode's median room latency
                room_b = j["bytes"] / max(1, j["rooms"])
                big[f"cpp_{mem}{tr}"] = {"gb_per_s": j["gb_per_s"], "room_ms_p50": j["room_latency_ms"]["p50"],
                                         "room_gb_per_s": room_b / 1e6 / j["room_latency_ms"]["p50"]}
            except (OSError, ValueError, KeyError):
                print(f"summarize.py: no room4096_cpp_{mem}{tr}.json", file=sys.stderr)
        try:
            j = load(os.path.join(out, f"vllm_room_gbps_{tr}.json"))
            big[f"vllm_{tr}"] = {k: j[k] for k in ("gb_per_s", "gb_per_s_min", "gb_per_s_max", "room_ms_p50")}
        except (OSError, ValueError, KeyError):
            print(f"summarize.py: no vllm_room_gbps_{tr}.json", file=sys.stderr)
    s["room_4096_gb_per_s"] = big
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=2)
    write_cdf(os.path.join(out, "latency_cdf_shm.csv"), shm["transfer_latency_cdf_ms"])
    write_cdf(os.path.join(out, "latency_cdf_tcp.csv"), tcp["transfer_latency_cdf_ms"])
    write_cdf(os.path.join(out, "latency_cdf_cp.csv"), cp_max["transfer_latency_cdf_ms"])

    print(f"write size {s['write_bytes']} bytes; {len(per_round)} interleaved rounds (GB/s)")
    print(f"{'round':>6}{'shm':>8}{'memcpy':>8}{'perftest':>9}{'tcp':>8}{'am':>8}{'am -O':>8}{'put':>8}"
          f"{'shm/mc':>8}{'shm/pt':>8}{'tcp/pt':>8}  room latency p99/max ms: shm, tcp (the round's stalls)")
    nan = float("nan")
    for x in per_round:
        print(f"{x['round']:>6}{x.get('kvferry_shm', 0):8.3f}{x.get('memcpy', 0):8.3f}{x.get('perftest_posix_put', 0):9.3f}"
              f"{x.get('kvferry_tcp', 0):8.3f}{x.get('perftest_tcp_am', 0):8.3f}{x.get('perftest_tcp_am_outstanding', 0):8.3f}"
              f"{x.get('perftest_tcp_put', 0):8.3f}{x['shm_vs_memcpy']:8.3f}{x['shm_vs_ucx_perftest']:8.3f}"
              f"{x['tcp_vs_ucx_perftest']:8.3f}  {x.get('shm_p99_ms', nan):.0f}/{x.get('shm_max_ms', nan):.0f}, "
              f"{x.get('tcp_p99_ms', nan):.0f}/{x.get('tcp_max_ms', nan):.0f}")
    for k in ("shm_vs_memcpy", "shm_vs_ucx_perftest", "tcp_vs_ucx_perftest"):
        print(f"{k}: median {s[k]['median']:.3f} (min {s[k]['min']:.3f}, max {s[k]['max']:.3f})")
    print(f"page faults per GB, worst rank of any round: shm {s['faults_per_gb']:.3f}, tcp {s['faults_per_gb_tcp']:.3f}")
    for tr, j in s.get("one_shard", {}).items():
        print(f"{'kvferry bench ' + tr + ', 1 shard':28}{j['gb_per_s']:8.3f}")
    if frag:
        print(f"{'fragmented':16}{'write B':>9}{'GB/s':>8}{'writes/s':>11}{'ns/write':>9}{'memcpy':>8}{'ratio':>7}{'perftest':>9}")
        for f in frag:
            print(f"{f['case']:16}{int(f['write_bytes']):9d}{float(f['kvferry_gb_per_s']):8.3f}{float(f['writes_per_s']):11.0f}"
                  f"{float(f['cpu_ns_per_write']):9.0f}{float(f['memcpy_gb_per_s'] or 0):8.3f}{f['vs_memcpy']:7.3f}"
                  f"{float(f['ucx_perftest_gb_per_s'] or 0):9.3f}")
    for k, j in (("shm", shm), ("tcp", tcp)):
        l = j["transfer_latency_ms"]
        print(f"latency {k}: p50 {l['p50']:.2f} p90 {l['p90']:.2f} p99 {l['p99']:.2f} ms; {j['cpu_s_per_gb']:.3f} CPU s/GB")
    cp = s["control_plane"]
    print(f"control plane: {cp['max_rooms_per_s']:.0f} rooms/s max (1+1 shm); at {cp['rate']:.0f} rooms/s "
          f"{cp['short']['cpu_us_per_room']:.1f} CPU us/room over {cp['short']['rooms']} rooms, "
          f"{cp['long']['cpu_us_per_room']:.1f} over {cp['long']['rooms']} rooms")
    for r in rss:
        print(f"  {r['rank']}: RssAnon {r['anon_kib_at_checkpoint']} KiB after {r['rooms_at_checkpoint']} rooms, "
              f"{r['anon_kib_at_end']} KiB after {r['rooms_at_end']} rooms")
    for name, f in fails.items():
        print(f"fault -> all ranks Failed, {name}: {f['faults']} faults, p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms")
    for name, d in deaths.items():
        print(f"peer death {name}: detected after {d['detections_ms']} ms")
    if "layerwise" in s:  # layer-wise streaming (issue 15)
        t = s["layerwise"]["tail_ms"]
        print(f"layer-wise ({s['layerwise']['ms_per_layer']} ms/layer): transfer tail p50/p99 "
              f"{t['on']['p50']:.2f}/{t['on']['p99']:.2f} ms, without {t['off']['p50']:.2f}/{t['off']['p99']:.2f} ms")
    for k, v in s["one_page_room_us"].items():
        print(f"one-page room, concurrency 1, {k.replace('_', ' ')}: p50 {v.get('p50_us', nan):.0f} "
              f"p90 {v.get('p90_us', nan):.0f} p99 {v.get('p99_us', nan):.0f} max {v.get('max_us', nan):.0f} us")
    for tr in ("tcp", "shm"):
        big = s["room_4096_gb_per_s"]
        c, e, v = big.get(f"cpp_{tr}", {}), big.get(f"cpp_engine_{tr}", {}), big.get(f"vllm_{tr}", {})
        if c or v:
            cg, eg, vg = c.get("gb_per_s", nan), e.get("gb_per_s", nan), v.get("gb_per_s", nan)
            print(f"4096-token room, concurrency 1, {tr}: C++ API {cg:.3f} GB/s (per room "
                  f"{c.get('room_gb_per_s', nan):.3f}, p50 {c.get('room_ms_p50', nan):.0f} ms), on engine buffers "
                  f"{eg:.3f} GB/s (p50 {e.get('room_ms_p50', nan):.0f} ms), vLLM connector "
                  f"{vg:.3f} GB/s (p50 {v.get('room_ms_p50', nan):.0f} ms); connector/C++ {vg / cg if cg > 0 else nan:.3f}, "
                  f"connector/C++ on engine buffers {vg / eg if eg > 0 else nan:.3f}")
    lw = s.get("layerwise_tail_ratio", float("nan"))
    print(f"shm_vs_memcpy={s['shm_vs_memcpy']['median']:.3f} shm_vs_ucx_perftest={s['shm_vs_ucx_perftest']['median']:.3f} "
          f"tcp_vs_ucx_perftest={s['tcp_vs_ucx_perftest']['median']:.3f} frag_4k_vs_memcpy={s['frag_4k_vs_memcpy']:.3f} "
          f"faults_per_gb={s['faults_per_gb']:.3f} layerwise_tail_ratio={lw:.3f} "
          f"propagation_p99_ms={s['propagation_p99_ms']:.3f} peer_death_detect_ms={s['peer_death_detect_ms']:.3f}")

if __name__ == "__main__":
    main()
