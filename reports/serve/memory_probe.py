#!/usr/bin/env python3
"""tandem serve's memory: its resident set (VmRSS of /proc/PID/status) after start-up, and after
N requests served, to give the memory a served request leaves behind (reports/serve/report.md).

Usage: python3 reports/serve/memory_probe.py TANDEM WORKLOAD [--requests 0,10000,40000]
                                             [--connections 8] [--prompt-len 32] [SERVE_ARG ...]

Starts `tandem serve WORKLOAD --backend sim --listen 127.0.0.1:0 SERVE_ARG...`, reads VmRSS once
it listens, then sends non-streamed completions (token-id prompts of --prompt-len, max_tokens 1)
over --connections keep-alive connections until each count of --requests has been served, and
reads VmRSS at each. Prints one row per count: requests served, VmRSS (MiB), and the bytes per
request over the previous row. Standard library only.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import tandem_tools  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tandem")
    ap.add_argument("workload")
    ap.add_argument("--requests", default="0,10000,40000")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    a, serve_args = ap.parse_known_args()
    counts = [int(x) for x in a.requests.split(",")]
    p = subprocess.Popen([a.tandem, "serve", a.workload, "--backend", "sim", "--listen", "127.0.0.1:0"] + serve_args,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = tandem_tools.listening_port(p)
    if port is None:
        print("memory_probe: the server did not start", file=sys.stderr)
        return 1
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/health")  # answered once the engine's run has started (its tables made)
    c.getresponse().read()
    c.close()
    body = json.dumps({"prompt": list(range(1, a.prompt_len + 1)), "max_tokens": 1}).encode()
    served = 0
    lock = threading.Lock()

    def client(n):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(n):
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"status {r.status}")
        c.close()

    print(f"{'requests served':>16} {'VmRSS MiB':>10} {'bytes/request since previous':>29}")
    prev = None
    for n in counts:
        todo = n - served
        if todo > 0:
            share = [todo // a.connections + (i < todo % a.connections) for i in range(a.connections)]
            ts = [threading.Thread(target=client, args=(k,)) for k in share if k]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            served = n
        kib = rss_kib(p.pid)
        per = f"{(kib - prev[1]) * 1024 / (n - prev[0]):.0f}" if prev and n > prev[0] else "-"
        print(f"{n:>16} {kib / 1024:>10.1f} {per:>29}", flush=True)
        prev = (n, kib)
    p.send_signal(signal.SIGINT)
    p.wait(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
