"""Shared by the tandem serve tests: start a server on a free port, talk HTTP with the stdlib only.

A server is started with --listen 127.0.0.1:0 and its port read from the line it prints on stderr
("listening on http://HOST:PORT"); every wait is bounded (generous, for a loaded machine), and a
server still running at the end is killed.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

START_TIMEOUT = 120  # a real backend warms up first


class Server:
    def __init__(self, tandem, workload, *args, env=None):
        self.cmd = [tandem, "serve", workload, "--listen", "127.0.0.1:0", *args]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stderr_lines = []
        self.port = None
        got = threading.Event()

        def read_stderr():
            for line in self.proc.stderr:
                self.stderr_lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.reader = threading.Thread(target=read_stderr, daemon=True)
        self.reader.start()
        if not got.wait(START_TIMEOUT) or self.port is None:
            self.kill()
            raise RuntimeError(f"server did not start: {' '.join(self.cmd)}\n{''.join(self.stderr_lines)}")

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict, body bytes); body: a dict (sent as JSON), bytes or None."""
        c = self.conn(timeout)
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post_json(self, path, body, **kw):
        status, _, data = self.request("POST", path, body, **kw)
        return status, json.loads(data) if data else None

    def stream(self, path, body, timeout=60):
        """A streamed call: (status, list of decoded data payloads: dicts, or the string '[DONE]')."""
        c = self.conn(timeout)
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            c.close()
            return r.status, [json.loads(data)]
        events = []
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            events.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
            if payload == "[DONE]":
                break
        c.close()
        return r.status, events

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200, status
        out = {}
        for line in data.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            # The name alone, or with its one distinguishing label: a bucket's le="..." or the
            # finish reason (e.g. 'vllm:request_success_total{finished_reason="abort"}').
            name, key = name_labels.split("{")[0], ""
            for label in ("le", "finished_reason"):
                found = re.search(label + r'="([^"]*)"', name_labels)
                if found:
                    key = f'{{{label}="{found.group(1)}"}}'
            out[name + key] = float(value)
        return out

    def stop(self, sig=signal.SIGINT, timeout=120):
        """Signals the server and waits: (exit status, stdout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"server did not stop within {timeout} s after signal {sig}")
        self.reader.join(10)
        return self.proc.returncode, out

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def wait_for(pred, timeout=60, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def raw_socket(port, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def check(cond, what):
    """Raises AssertionError(what) unless cond; prints `ok: what` when it holds."""
    if not cond:
        raise AssertionError(what)
    print(f"  ok: {what}")


def run_bench_client_tool(tool, tandem, src, out, *args):
    """Runs tools/TOOL (a third-party benchmark client against tandem serve: sglang-bench, vllm-bench)
    on workloads/serve_sim.yaml into OUT with ARGS and returns its OUT/table.json; None when the tool
    skipped (exit 77: its venv is not installed), having printed why."""
    import sys
    p = subprocess.run([sys.executable, os.path.join(src, "tools", tool), "--tandem", tandem,
                        "--workload", os.path.join(src, "workloads", "serve_sim.yaml"), "--out", out, *args],
                       capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
        print(p.stderr.strip())
        return None
    print(p.stdout)
    check(p.returncode == 0, f"tools/{tool} exit 0 ({p.stderr.strip()[-500:]})")
    with open(os.path.join(out, "table.json")) as f:
        return json.load(f)
