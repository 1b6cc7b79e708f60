#!/usr/bin/env python3
"""tandem serve, end to end, with a client of the standard library only (http.client, socket).

Usage: serve_test.py TANDEM SOURCE_DIR [sim|cpu|pd-copy|pd-tcp]

sim       workloads/serve_sim.yaml (Llama-3-8B on an H200, the cost model's step times under the
          wall clock), a small KV cache (--set engine.num_kv_blocks=100) so that a request can
          be too large for it:
  api       /health, /v1/models; completions: a string prompt, token ids, a list of prompts,
            streamed (one token a chunk, finish_reason on the last, the usage chunk, [DONE]) and
            not; chat (the fixed template's byte count as prompt_tokens): usage counts exact
  metrics   one request alone (5 prompt ids, 7 tokens): vLLM's per-request histograms (queue,
            prefill, decode, inference, time per output token, e2e, prompt/generation tokens,
            max_tokens) count it once with its exact sizes, its phases add up, the steps'
            tokens (iteration_tokens_total) are 5 + 6 in 7 steps; a streamed prompt's tokens count
            at its first token (vllm:prompt_tokens_total mid-stream)
  errors    malformed JSON, wrong types, temperature 0.7, n 2, an unknown model, a prompt too
            large for the KV cache (400 naming max_tokens), a token id outside the vocabulary,
            an oversized body (413), too many connections (503), a full queue (503), unknown
            path (404), wrong method (405), a missing API key (401): each an OpenAI error object
  cancel    a client that leaves mid-stream: its request is cancelled (/metrics: cancelled 1,
            nothing running), and the server goes on serving
  max requests  --max-requests 3: the 4th request gets 503 naming the limit; -1 is refused (exit 2)
  send threads  48 streams at once with --send-threads 2 and 1: 40 one-byte chunks each, once and
            in order, the same streams; --send-threads 3 is refused
  shutdown  SIGINT with a stream in flight: exit 0, the stream ends with an error event naming
            the shutdown; --out has requests.csv (one row per request, the cancelled ones so
            marked), summary.json, arrivals.csv and served_workload.yaml, which `tandem run`
            replays (as many requests)
cpu       workloads/cpu_tiny.yaml --backend cpu: the api checks, and golden: the token ids
          streamed for 4 concurrent prompts equal `tandem generate`'s for each prompt alone;
          golden through the server: with --out and --record-prompts, 12 more concurrent prompts
          (text and token ids, 4 sharing a 40-token prefix), then `tandem run` of the served
          workload on the CPU backend (arrivals.csv gives the clients' prompt ids): the ids each
          client was streamed, and every served request's output_tokens, equal the run's, token
          for token
pd-copy, pd-tcp   workloads/cpu_stage4_pd.yaml (1P1D on the CPU backend) over the copy / tcp
          channel: the api checks, and /metrics counts KV transfers > 0; again with
          disaggregation.first_token_from=decode (D streams the first token, after the transfer)
"""
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from serve_helpers import Server, wait_for  # noqa: E402

CHAT_TEMPLATE = "<|{role}|>\n{content}\n"


def chat_len(messages):
    return len(("".join(CHAT_TEMPLATE.format(**m) for m in messages) + "<|assistant|>\n").encode())


def leave(conn, resp):
    """A client that goes away mid-stream: its socket shut down and closed (the response owns it
    once the server said Connection: close)."""
    sock = conn.sock or resp.fp.raw._sock
    sock.shutdown(socket.SHUT_RDWR)
    resp.close()
    conn.close()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok: {what}")


def api_checks(s, model):
    st, _, body = s.request("GET", "/health")
    check(st == 200, "/health 200")
    st, _, body = s.request("GET", "/v1/models")
    m = json.loads(body)
    check(st == 200 and m["data"][0]["id"] == model and m["data"][0]["root"] == model, f"/v1/models names {model}")

    st, r = s.post_json("/v1/completions", {"model": model, "prompt": "hello world", "max_tokens": 5, "temperature": 0})
    check(st == 200 and r["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
          f"non-streamed completion: usage exact ({r.get('usage')})")
    check(len(r["choices"][0]["text"]) == 5 and r["choices"][0]["finish_reason"] == "length", "5 bytes of text")

    st, r = s.post_json("/v1/completions", {"prompt": [1, 2, 3, 250], "max_tokens": 3, "return_token_ids": True})
    check(st == 200 and r["usage"]["prompt_tokens"] == 4 and len(r["choices"][0]["token_ids"]) == 3,
          "token-id prompt: 4 prompt tokens, 3 token ids back")

    st, r = s.post_json("/v1/completions", {"prompt": ["ab", [7, 8, 9]], "max_tokens": 2})
    check(st == 200 and [c["index"] for c in r["choices"]] == [0, 1] and r["usage"]["prompt_tokens"] == 5
          and r["usage"]["completion_tokens"] == 4, "a list of two prompts: two choices, usage summed")

    st, ev = s.stream("/v1/completions", {"prompt": "stream me", "max_tokens": 6, "stream": True,
                                          "stream_options": {"include_usage": True}, "ignore_eos": True})
    chunks = [e for e in ev if isinstance(e, dict) and e["choices"]]
    usage = [e for e in ev if isinstance(e, dict) and not e["choices"]]
    check(st == 200 and len(chunks) == 6 and all(len(c["choices"][0]["text"]) == 1 for c in chunks),
          "streamed completion: 6 chunks of one token each")
    check(chunks[-1]["choices"][0]["finish_reason"] == "length" and
          all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), "finish_reason on the last chunk only")
    check(len(usage) == 1 and usage[0]["usage"]["prompt_tokens"] == 9 and usage[0]["usage"]["completion_tokens"] == 6
          and ev[-1] == "[DONE]", "usage chunk exact, then [DONE]")

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    st, r = s.post_json("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 4})
    check(st == 200 and r["usage"]["prompt_tokens"] == chat_len(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]) and
          r["usage"]["completion_tokens"] == 4 and len(r["choices"][0]["message"]["content"]) == 4,
          "chat, not streamed: the template's bytes as prompt tokens, 4 tokens")
    st, ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "stream": True,
                                               "stream_options": {"include_usage": True}})
    deltas = [e["choices"][0]["delta"] for e in ev if isinstance(e, dict) and e["choices"]]
    check(st == 200 and len(deltas) == 3 and deltas[0].get("role") == "assistant" and
          all(len(d["content"]) == 1 for d in deltas), "chat streamed: 3 deltas of one token")
    check(ev[-2]["usage"]["completion_tokens"] == 3, "chat usage chunk")


def metrics_check(s):
    """One request alone on the server (5 prompt ids, 7 tokens): every vLLM per-request histogram
    counts it once with its exact sizes, its phases add up, and the steps' tokens are 5 + 6."""
    before = s.metrics()
    st, r = s.post_json("/v1/completions", {"prompt": [10, 11, 12, 13, 14], "max_tokens": 7})
    check(st == 200 and r["usage"]["completion_tokens"] == 7, "metrics: the request served")
    after = s.metrics()
    d = lambda key: after.get(key, 0) - before.get(key, 0)  # noqa: E731
    timed = ["e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
             "request_inference_time", "request_time_per_output_token"]
    sized = ["request_prompt_tokens", "request_generation_tokens", "request_params_max_tokens"]
    counts = {name: d(f"vllm:{name}_seconds_count") for name in timed}
    counts.update({name: d(f"vllm:{name}_count") for name in sized})
    check(all(c == 1 for c in counts.values()), f"metrics: each per-request histogram counted it once ({counts})")
    check(d('vllm:request_success_total{finished_reason="length"}') == 1 and
          d('vllm:request_success_total{finished_reason="abort"}') == 0, "metrics: one more finished by length")
    check(d("vllm:request_prompt_tokens_sum") == 5 and d("vllm:request_generation_tokens_sum") == 7 and
          d("vllm:request_params_max_tokens_sum") == 7, "metrics: its sizes, 5 prompt and 7 generated tokens")
    check(d('vllm:request_prompt_tokens_bucket{le="5"}') == 1 and d('vllm:request_prompt_tokens_bucket{le="2"}') == 0,
          "metrics: 5 prompt tokens in the le=5 bucket, not in le=2")
    sec = lambda name: d(f"vllm:{name}_seconds_sum")  # noqa: E731
    check(abs(sec("request_prefill_time") + sec("request_decode_time") - sec("request_inference_time")) < 1e-6 and
          abs(sec("request_queue_time") + sec("request_inference_time") - sec("e2e_request_latency")) < 1e-6,
          "metrics: prefill + decode = inference, queue + inference = e2e")
    check(sec("request_decode_time") > 0 and
          abs(sec("request_time_per_output_token") - sec("request_decode_time") / 6) < 1e-6,
          "metrics: time per output token = decode / 6")
    check(d("vllm:iteration_tokens_total_sum") == 11 and d("vllm:iteration_tokens_total_count") == 7,
          f"metrics: 7 steps computed 5 + 6 tokens ({d('vllm:iteration_tokens_total_sum'):.0f} in "
          f"{d('vllm:iteration_tokens_total_count'):.0f})")
    check(after["vllm:num_preemptions_total"] == 0, "metrics: no preemptions")
    # A prompt counts at its first token, not at its request's end: mid-stream it is there.
    before = s.metrics()
    c = s.conn()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 400,
                                                          "stream": True}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    while not r.fp.readline().startswith(b"data: "):
        pass
    mid = s.metrics()
    check(mid["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 6 and
          mid["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == 6 and
          mid["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"],
          "metrics: a prompt's 6 tokens counted at its first token, its request still running")
    leave(c, r)
    wait_for(lambda: s.metrics()["vllm:num_requests_running"] == 0 or None, 60, "the stream left")


def error_checks(s, model, port):
    def err(status, body, param, what, path="/v1/completions"):
        st, _, data = s.request("POST", path, body)
        e = json.loads(data)["error"]
        check(st == status and e["param"] == param and e["message"], f"{what}: {st} param={e['param']!r}: "
                                                                       f"{e['message']}")
    err(400, b"{not json", None, "malformed JSON")
    err(400, b"[1, 2]", None, "a body that is not an object")
    err(400, {"prompt": "x", "max_tokens": "5"}, "max_tokens", "max_tokens as a string")
    err(400, {"prompt": 5}, "prompt", "prompt as a number")
    err(400, {"prompt": []}, "prompt", "an empty prompt list")
    err(400, {"max_tokens": 5}, "prompt", "no prompt")
    err(400, {"prompt": "x", "temperature": 0.7}, "temperature", "temperature 0.7")
    err(400, {"prompt": "x", "n": 2}, "n", "n 2")
    err(400, {"prompt": "x", "stream": "yes"}, "stream", "stream as a string")
    err(400, {"prompt": [1, -4]}, "prompt", "a negative token id")
    err(400, {"prompt": [10 ** 9]}, "prompt", "a token id outside the vocabulary")
    err(400, {"prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens 0")
    err(400, {"prompt": "x" * 1000, "max_tokens": 1000}, "max_tokens", "a request the KV cache can never hold")
    err(404, {"prompt": "x", "model": "other"}, "model", "an unknown model")
    err(400, {"messages": "hi"}, "messages", "chat messages as a string", "/v1/chat/completions")
    err(400, {"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]}, "messages",
        "a content part whose type is a number", "/v1/chat/completions")
    err(400, {"messages": [{"role": "user", "content": 5}]}, "messages", "a content as a number",
        "/v1/chat/completions")
    err(400, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
        "stream_options without stream")
    err(413, {"prompt": "y" * 300000}, None, "a body over --max-body-bytes")
    st, _, _ = s.request("GET", "/nowhere")
    check(st == 404, "an unknown path: 404")
    st, _, _ = s.request("GET", "/v1/completions")
    check(st == 405, "GET on a POST endpoint: 405")
    # Connections: --max-connections 8; hold 8 open (idle), the next is answered 503.
    held = []
    for _ in range(8):  # each answered once (keep-alive): the server has taken it
        h = s.conn()
        h.request("GET", "/health")
        h.getresponse().read()
        held.append(h)
    extra = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = b""
    while True:
        b = extra.recv(4096)
        if not b:
            break
        data += b
    check(data.startswith(b"HTTP/1.1 503") and b"too many connections" in data, "a 9th connection: 503")
    extra.close()
    for h in held:
        h.close()
    wait_for(lambda: s.request("GET", "/health")[0] == 200, 30, "connections released")


def queue_check(s):
    # --max-queue 2: two long streams hold the queue, a third request is answered 503.
    conns = []
    for _ in range(2):
        c = s.conn()
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "q", "max_tokens": 600, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.fp.readline()  # the first chunk is there: the request runs
        conns.append((c, r))
    st, r = s.post_json("/v1/completions", {"prompt": "third", "max_tokens": 2})
    check(st == 503 and "queue is full" in r["error"]["message"], "a full queue: 503")
    for c, r in conns:  # leaving mid-stream: both cancelled
        leave(c, r)
    wait_for(lambda: s.metrics().get("tandem:requests_cancelled_total", 0) >= 2, 60, "both cancelled")


def cancel_check(s):
    before = s.metrics().get("tandem:requests_cancelled_total", 0)
    c = s.conn()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "leave", "max_tokens": 1200, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    got = 0
    while got < 3:
        line = r.fp.readline()
        got += line.startswith(b"data: ")
    leave(c, r)
    m = wait_for(lambda: (lambda m: m if m.get("tandem:requests_cancelled_total", 0) >= before + 1 and
                          m["vllm:num_requests_running"] == 0 else None)(s.metrics()), 60, "the cancel")
    check(m["tandem:requests_cancelled_total"] == before + 1, "a client that left mid-stream: its request cancelled")
    st, r = s.post_json("/v1/completions", {"prompt": "still here", "max_tokens": 2})
    check(st == 200, "the server goes on serving")


def many_streams(port, n, max_tokens):
    """n streamed completions at once (raw sockets): each stream's texts, chunk by chunk."""
    texts = [None] * n
    start = threading.Barrier(n)

    def one(i):
        body = json.dumps({"prompt": [7 + i, 1000, 1001], "max_tokens": max_tokens, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
            start.wait()
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            data = b""
            while chunk := c.recv(65536):
                data += chunk
        events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
        texts[i] = ([json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]"], events[-1] == "[DONE]")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return texts


def send_threads_check(tandem, workload):
    """48 streams at once, so that a step's chunks for 48 sockets are sent as one batch (split
    between two threads from 16): every chunk arrives once, in order, and the streams equal those
    of the io thread sending alone."""
    got = {}
    for threads in ("2", "1"):
        s = Server(tandem, workload, "--send-threads", threads)
        try:
            got[threads] = many_streams(s.port, 48, 40)
        finally:
            s.stop()
        check(all(done and len(chunks) == 40 and all(len(c) == 1 for c in chunks) for chunks, done in got[threads]),
              f"--send-threads {threads}: 48 streams at once, 40 one-byte chunks each, then [DONE]")
    check(got["2"] == got["1"], "--send-threads 2 streams what --send-threads 1 does, chunk for chunk")
    # Refused before anything is set up: the port given is taken, and the error still names the option.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([tandem, "serve", workload, "--send-threads", "3", "--listen", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--send-threads 3" in r.stderr,
          f"--send-threads 3 is refused, naming it, before the (taken) port ({r.stderr.strip()[-120:]})")


def shutdown_check(s, tandem, out):
    c = s.conn()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "drain", "max_tokens": 1500, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.fp.readline()
    rc, stdout = s.stop(signal.SIGINT)
    rest = r.read().decode()
    check(rc == 0, f"SIGINT: exit 0 (stdout: {stdout.splitlines()[:1]})")
    check("shutting down" in rest and rest.rstrip().endswith("data: [DONE]"),
          "the stream in flight ended with an error event naming the shutdown")
    with open(os.path.join(out, "requests.csv")) as f:
        rows = list(csv.DictReader(f))
    statuses = {r["status"] for r in rows}
    check(len(rows) >= 10 and "cancelled" in statuses and "finished" in statuses,
          f"requests.csv: {len(rows)} rows, statuses {sorted(statuses)}")
    summary = json.load(open(os.path.join(out, "summary.json")))
    check(summary["requests"]["cancelled"] >= 3, f"summary.json: {summary['requests']}")
    arrivals = list(csv.DictReader(open(os.path.join(out, "arrivals.csv"))))
    check(len(arrivals) == len(rows), "arrivals.csv: one row per request served")
    replay = os.path.join(out, "replay")
    p = subprocess.run([tandem, "run", os.path.join(out, "served_workload.yaml"), "--out", replay, "--quiet"],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"tandem run replays served_workload.yaml ({p.stderr.strip()[:200]})")
    replayed = list(csv.DictReader(open(os.path.join(replay, "requests.csv"))))
    check(len(replayed) == len(rows), f"the replay has as many requests ({len(replayed)})")


def golden_check(s, tandem, seed):
    prompts = [[5, 17, 300, 42], list(range(100, 160)), [9] * 20, [1, 2]]
    results = [None] * len(prompts)

    def one(i):
        st, ev = s.stream("/v1/completions", {"prompt": prompts[i], "max_tokens": 12, "stream": True,
                                              "return_token_ids": True})
        results[i] = [e["choices"][0]["token_ids"][0] for e in ev if isinstance(e, dict) and e["choices"]]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, p in enumerate(prompts):
        g = subprocess.run([tandem, "generate", "--model", "tiny", "--seed", str(seed), "--prompt",
                            " ".join(map(str, p)), "--max-tokens", "12", "--threads", "1"],
                           capture_output=True, text=True, timeout=300)
        want = [int(x) for x in g.stdout.split()]
        check(results[i] == want, f"golden: prompt {i}: served token ids equal tandem generate's ({want[:4]}...)")


def max_requests_check(tandem, workload):
    """--max-requests N: the N-th request is served, the next gets 503 naming the limit."""
    s = Server(tandem, workload, "--max-requests", "3")
    try:
        for i in range(3):
            st, body = s.post_json("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
            check(st == 200 and body["usage"]["completion_tokens"] == 2, f"--max-requests 3: request {i + 1}: 200")
        st, body = s.post_json("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
        msg = body["error"]["message"] if body else ""
        check(st == 503 and "--max-requests" in msg and "3 requests" in msg, f"request 4: 503 ({msg})")
    finally:
        s.stop()
    p = subprocess.run([tandem, "serve", workload, "--max-requests", "-1"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "--max-requests -1" in p.stderr, f"--max-requests -1: exit 2 ({p.stderr.strip()})")


def golden_run_check(s, tandem, out):
    """The token ids streamed by serve --backend cpu equal `tandem run`'s for the same prompts."""
    shared = list(range(200, 240))
    prompts = ([list(range(7 * i, 7 * i + 5 + 9 * i)) for i in range(4)] +          # token ids, 5..32 long
               [f"prompt {i}: the quick brown fox" * (i + 1) for i in range(4)] +  # text: its UTF-8 bytes
               [shared + [i, i + 1] for i in range(4)])                           # a shared prefix (cache hits)
    keys = [tuple(p) if isinstance(p, list) else tuple(p.encode()) for p in prompts]
    streamed = [None] * len(prompts)

    def one(i):
        st, ev = s.stream("/v1/completions", {"prompt": prompts[i], "max_tokens": 9 + i, "stream": True,
                                              "return_token_ids": True})
        streamed[i] = [e["choices"][0]["token_ids"][0] for e in ev if isinstance(e, dict) and e["choices"]]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]  # at once: batched together
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(8, len(prompts)):  # one after another: each finds the shared prefix cached
        one(i)
    rc, _ = s.stop(signal.SIGINT)
    check(rc == 0, "SIGINT: exit 0")
    arrivals = list(csv.DictReader(open(os.path.join(out, "arrivals.csv"))))
    served = list(csv.DictReader(open(os.path.join(out, "requests.csv"))))
    check(len(arrivals) == len(served) and all("prompt_token_ids" in a for a in arrivals),
          f"arrivals.csv: {len(arrivals)} rows with prompt_token_ids")
    replay = os.path.join(out, "replay")
    p = subprocess.run([tandem, "run", os.path.join(out, "served_workload.yaml"), "--backend", "cpu", "--threads", "1",
                        "--out", replay, "--quiet", "--trace", "none"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"tandem run --backend cpu replays the served prompts ({p.stderr.strip()[:300]})")
    ran = list(csv.DictReader(open(os.path.join(replay, "requests.csv"))))
    check(len(ran) == len(served), f"the replay has as many requests ({len(ran)} of {len(served)})")
    by_prompt = {tuple(int(x) for x in a["prompt_token_ids"].split()): i for i, a in enumerate(arrivals)}
    stream_tokens = 0
    for i, key in enumerate(keys):
        row = by_prompt.get(key)
        check(row is not None, f"prompt {i} is in arrivals.csv")
        want = [int(x) for x in ran[row]["output_tokens"].split()]
        check(streamed[i] == want and len(want) == 9 + i,
              f"prompt {i}: the {len(streamed[i] or [])} ids streamed equal tandem run's ({want[:3]}...)")
        stream_tokens += len(want)
    compared = tokens = 0
    for a, b in zip(served, ran):  # every request served (the api checks' too): serve's record vs the run's
        if a["status"] != "finished":
            continue
        check(a["output_tokens"] == b["output_tokens"] and a["output_tokens"],
              f"request {a['id']}: served output_tokens equal tandem run's")
        compared += 1
        tokens += len(b["output_tokens"].split())
    hits = json.load(open(os.path.join(replay, "summary.json")))["prefix_cache"]["hit_tokens"]
    check(compared >= len(prompts) and hits > 0, f"prefix-cache hit tokens in the replay: {hits}")
    print(f"golden through the server: {len(prompts)} streams ({stream_tokens} token ids as streamed) and all "
          f"{compared} finished requests of requests.csv ({tokens} token ids) equal tandem run's")


def main():
    tandem, src = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "sim"
    wl = lambda name: os.path.join(src, "workloads", name)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "sim":
            tok = os.path.join(tmp, "tok")
            subprocess.run([tandem, "serve", "--write-tokenizer", "--out", tok], check=True, timeout=60)
            t = json.load(open(os.path.join(tok, "tokenizer.json")))
            vocab = t["model"]["vocab"]
            check(sorted(vocab.values()) == list(range(256)) and len(vocab) == 256 and not t["model"]["merges"] and
                  t["pre_tokenizer"]["type"] == "ByteLevel" and t["decoder"]["type"] == "ByteLevel" and
                  vocab["h"] == ord("h") and vocab["\u0120"] == 32,
                  "tokenizer.json: 256 byte-level symbols, id = byte value, no merges")
            key = os.path.join(tmp, "key")
            open(key, "w").write("sesame\n")
            s = Server(tandem, wl("serve_sim.yaml"), "--set", "engine.num_kv_blocks=100", "--max-connections", "8",
                       "--max-body-bytes", "200000", "--max-queue", "2", "--drain-s", "1", "--out", os.path.join(tmp, "out"))
            try:
                print("api:")
                api_checks(s, "llama3-8b")
                print("metrics:")
                metrics_check(s)
                print("errors:")
                error_checks(s, "llama3-8b", s.port)
                print("queue:")
                queue_check(s)
                print("cancel:")
                cancel_check(s)
                print("shutdown:")
                shutdown_check(s, tandem, os.path.join(tmp, "out"))
            finally:
                s.kill()
            print("max requests:")
            max_requests_check(tandem, wl("serve_sim.yaml"))
            print("send threads:")
            send_threads_check(tandem, wl("serve_sim.yaml"))
            s = Server(tandem, wl("serve_sim.yaml"), "--api-key-file", key)
            try:
                st, _, _ = s.request("GET", "/v1/models")
                check(st == 401, "no API key: 401")
                st, _, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})
                check(st == 200, "the API key: 200")
            finally:
                s.stop()
        elif mode == "cpu":
            out = os.path.join(tmp, "out")
            s = Server(tandem, wl("cpu_tiny.yaml"), "--backend", "cpu", "--threads", "1", "--out", out,
                       "--record-prompts", "--trace", "none")
            try:
                api_checks(s, "tiny")
                golden_check(s, tandem, 5)
                print("golden through the server:")
                golden_run_check(s, tandem, out)
            finally:
                s.kill()
        elif mode in ("pd-copy", "pd-tcp"):
            kind = mode.split("-")[1]
            s = Server(tandem, wl("cpu_stage4_pd.yaml"), "--backend", "cpu", "--threads", "1", "--set",
                       "disaggregation.enabled=true", "--set", f"disaggregation.channel.kind={kind}")
            try:
                model = json.loads(s.request("GET", "/v1/models")[2])["data"][0]["id"]
                api_checks(s, model)
                m = s.metrics()
                check(m["tandem:kv_transfers_total"] > 0, f"KV transfers: {m['tandem:kv_transfers_total']:.0f}")
            finally:
                s.stop()
            # The first token from D after the transfer (not from P's step): it reaches the client
            # from the transfer's event, the rest from D's steps.
            s = Server(tandem, wl("cpu_stage4_pd.yaml"), "--backend", "cpu", "--threads", "1", "--set",
                       "disaggregation.enabled=true", "--set", f"disaggregation.channel.kind={kind}", "--set",
                       "disaggregation.first_token_from=decode")
            try:
                print("first token from decode:")
                api_checks(s, model)
                m = s.metrics()
                check(m["tandem:kv_transfers_total"] > 0 and m["vllm:request_prefill_time_seconds_count"] > 0,
                      f"first token from D: KV transfers {m['tandem:kv_transfers_total']:.0f}")
            finally:
                s.stop()
        else:
            print(f"unknown mode {mode}")
            return 2
    print("serve test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
