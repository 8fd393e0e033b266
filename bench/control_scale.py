#!/usr/bin/env python3
"""The control plane's cost as instances grow (issue 34 item 6; docs/BENCHMARKS.md "Control plane
at scale").

For each total N of instances (default 2, 8, 32: N/2 prefill and N/2 decode instances, TP1 each),
runs `kvferry replay --prefill-instances N/2 --decode-instances N/2 --metrics` over tcp with small
pools and rooms of one page (a generated trace: one request every --gap-ms, input = one page,
output 1 token), scrapes every rank's /metrics twice while rooms flow (--window-s apart), and gives:
  - control frames (and bytes) sent per room, all ranks together, over the window;
  - heartbeats per second, all ranks together and per rank, against the model
    (each rank sends one heartbeat per watched peer per heartbeat_interval: 10/s per peer);
  - peers per rank (kvferry_peer_connections) and resident memory per rank
    (process_resident_memory_bytes), and memory per peer: the slope of a rank's resident memory
    against its peer count over all runs (least squares, per role).
Writes OUT/control_scale.json and prints a Markdown table.

Usage: bench/control_scale.py [--kvferry build/kvferry] [--out out/control_scale] [--sizes 2,8,32]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$')


def scrape(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict(kv.split('=', 1) for kv in re.findall(r'[a-z_]+="[^"]*"', m.group(2)))
        extra = tuple(sorted((k, v.strip('"')) for k, v in labels.items() if k not in ('rank', 'role')))
        out[(m.group(1), extra)] = float(m.group(3))
    return out


def scrape_all(urls):
    """Every rank at once (threads), so the window is the same for all of them on a busy machine."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(urls)) as pool:
        futures = {r: pool.submit(scrape, u) for r, u in urls.items()}
        return {r: f.result() for r, f in futures.items()}


def total(samples, name, **labels):
    want = tuple(sorted(labels.items()))
    return sum(v for (n, extra), v in samples.items() if n == name and all(x in extra for x in want))


def write_trace(path, requests, gap_ms, tokens):
    with open(path, 'w') as f:
        for i in range(requests):
            f.write(json.dumps({'timestamp': i * gap_ms, 'input_length': tokens, 'output_length': 1,
                                'hash_ids': [i]}) + '\n')


def metrics_urls(out_dir, deadline):
    """DIR/metrics.json (docs/metrics.md): {rank: {url, port, ...}}, once every port is known."""
    path = os.path.join(out_dir, 'metrics.json')
    while time.time() < deadline:
        try:
            with open(path) as f:
                j = json.load(f)
            if j and all(isinstance(v, dict) and v.get('url') for v in j.values()):
                return {rank: v['url'] for rank, v in j.items()}
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    return {}


def run_size(args, n):
    p = d = n // 2
    out_dir = os.path.abspath(os.path.join(args.out, f'n{n}'))
    shutil.rmtree(out_dir, ignore_errors=True)  # a stale metrics.json would name old ports
    os.makedirs(out_dir)
    trace = os.path.join(out_dir, 'trace.jsonl')
    requests = int((args.warmup_s + args.window_s + 10) * 1000 / args.gap_ms)
    write_trace(trace, requests, args.gap_ms, args.page_size)
    cmd = [args.kvferry, 'replay', '--trace', trace, '--model', args.model, '--page-size', str(args.page_size),
           '--pool-mib', str(args.pool_mib), '--prefill-pool-mib', str(args.pool_mib), '--transport', 'tcp',
           '--time-scale', '1', '--metrics', '--out', out_dir, '--progress', 'off', '--chunk-tokens',
           str(args.page_size)]
    if n > 2:
        cmd += ['--prefill-instances', str(p), '--decode-instances', str(d)]
    log = open(os.path.join(out_dir, 'replay.out'), 'w')
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    urls = metrics_urls(out_dir, time.time() + args.start_timeout_s)
    if not urls:
        proc.kill()
        sys.exit(f'n={n}: no metrics.json with URLs in {out_dir} (see replay.out)')
    time.sleep(args.warmup_s)
    t1 = time.monotonic()
    first = scrape_all(urls)
    time.sleep(args.window_s)
    t2 = time.monotonic()
    second = scrape_all(urls)
    rc = proc.wait()
    dt = t2 - t1
    sent = sum(total(second[r], 'kvferry_control_frames_total', direction='sent') -
               total(first[r], 'kvferry_control_frames_total', direction='sent') for r in urls)
    sent_bytes = sum(total(second[r], 'kvferry_control_bytes_total', direction='sent') -
                     total(first[r], 'kvferry_control_bytes_total', direction='sent') for r in urls)
    hb = sum(total(second[r], 'kvferry_heartbeats_sent_total') - total(first[r], 'kvferry_heartbeats_sent_total')
             for r in urls)
    # A room counts once per decode rank it is released on (TP1: once).
    rooms = sum(total(second[r], 'kvferry_rooms_total') - total(first[r], 'kvferry_rooms_total')
                for r in urls if r.startswith('decode'))
    per_rank = []
    for r in sorted(urls):
        per_rank.append({'rank': r, 'peers': total(second[r], 'kvferry_peer_connections'),
                         'rss_bytes': total(second[r], 'process_resident_memory_bytes'),
                         'heartbeats_per_s': (total(second[r], 'kvferry_heartbeats_sent_total') -
                                              total(first[r], 'kvferry_heartbeats_sent_total')) / dt})
    model_hb = sum(x['peers'] for x in per_rank) * 1000.0 / args.heartbeat_interval_ms
    report = {}
    try:
        with open(os.path.join(out_dir, 'report.json')) as f:
            report = json.load(f)
    except (OSError, ValueError):
        pass
    return {'instances': n, 'prefill_instances': p, 'decode_instances': d, 'replay_exit': rc,
            'command': ' '.join(cmd), 'window_s': dt, 'rooms_in_window': rooms,
            'frames_per_room': sent / rooms if rooms else None,
            'bytes_per_room': sent_bytes / rooms if rooms else None,
            'heartbeats_per_s': hb / dt, 'heartbeats_per_s_model': model_hb,
            'requests': report.get('requests'), 'ranks': per_rank}


def slope(points):
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--kvferry', default='build/kvferry')
    ap.add_argument('--out', default='out/control_scale')
    ap.add_argument('--sizes', default='2,8,32')
    ap.add_argument('--model', default='Llama-3.1-8B')
    ap.add_argument('--page-size', type=int, default=16)
    ap.add_argument('--pool-mib', type=int, default=16)
    ap.add_argument('--gap-ms', type=float, default=20)
    ap.add_argument('--warmup-s', type=float, default=10)
    ap.add_argument('--window-s', type=float, default=15)
    ap.add_argument('--start-timeout-s', type=float, default=180)
    ap.add_argument('--heartbeat-interval-ms', type=float, default=100)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = [run_size(args, int(s)) for s in args.sizes.split(',')]
    mem = {}
    for role in ('prefill', 'decode'):
        pts = [(x['peers'], x['rss_bytes']) for r in runs for x in r['ranks'] if x['rank'].startswith(role)]
        s = slope(pts)
        mem[role] = None if s is None else s / 1024.0
    result = {'runs': runs, 'rss_kib_per_peer': mem}
    with open(os.path.join(args.out, 'control_scale.json'), 'w') as f:
        json.dump(result, f, indent=1)
    print('| instances (P+D) | rooms in window | control frames / room | control bytes / room | '
          'heartbeats/s (model) | peers per rank | RSS per rank, MiB (min-max) |')
    print('|---|---|---|---|---|---|---|')
    for r in runs:
        peers = [x['peers'] for x in r['ranks']]
        rss = [x['rss_bytes'] / 2**20 for x in r['ranks']]
        fpr = r['frames_per_room']
        bpr = r['bytes_per_room']
        print(f"| {r['instances']} ({r['prefill_instances']}+{r['decode_instances']}) | {r['rooms_in_window']:.0f} | "
              f"{fpr:.2f} | {bpr:.0f} | {r['heartbeats_per_s']:.0f} ({r['heartbeats_per_s_model']:.0f}) | "
              f"{min(peers):.0f}-{max(peers):.0f} | {min(rss):.1f}-{max(rss):.1f} |" if fpr is not None else
              f"| {r['instances']} | 0 rooms in the window | | | | | |")
    print(f"RSS per peer (slope over all runs): prefill {mem['prefill']} KiB, decode {mem['decode']} KiB")
    return 0 if all(r['replay_exit'] == 0 for r in runs) else 1


if __name__ == '__main__':
    sys.exit(main())
