#!/usr/bin/env python3
"""tandem serve with the official `openai` SDK (PyPI) as the client.

Usage: serve_openai_test.py TANDEM SOURCE_DIR [sim|cpu|pd-copy|pd-tcp]

Runs itself under SOURCE_DIR/.venv-serve/bin/python (tools/setup --serve); exit 77 (skipped) when
that venv or its openai package is missing. Against `tandem serve` (--backend sim on
workloads/serve_sim.yaml; cpu on workloads/cpu_tiny.yaml; 1P1D on workloads/cpu_stage4_pd.yaml
over copy or tcp):
  models          client.models.list(): the served model
  completions     a string prompt, token ids, streamed with include_usage and not: usage exact
  chat            messages with string and text-part contents, streamed and not: usage exact
  errors          temperature 0.7 and n 2 raise openai.BadRequestError naming the field
  disconnect      a stream closed after 3 chunks: /metrics counts it cancelled, nothing running
  PD              transfers > 0 (tandem:kv_transfers_total)
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))


def reexec_in_venv():
    src = sys.argv[2]
    py = os.path.join(src, ".venv-serve", "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(src, ".venv-serve")):
        return
    if not os.path.exists(py):
        print("skipped: no .venv-serve (tools/setup --serve)")
        sys.exit(77)
    if subprocess.run([py, "-c", "import openai"], capture_output=True).returncode != 0:
        print("skipped: .venv-serve has no openai package (tools/setup --serve)")
        sys.exit(77)
    os.execv(py, [py, *sys.argv])


def main():
    import openai  # noqa: E402

    sys.path.insert(0, HERE)
    from serve_helpers import Server, wait_for  # noqa: E402

    tandem, src = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "sim"
    wl = lambda n: os.path.join(src, "workloads", n)  # noqa: E731
    args = {"sim": [wl("serve_sim.yaml")], "cpu": [wl("cpu_tiny.yaml"), "--backend", "cpu", "--threads", "1"]}
    if mode.startswith("pd-"):
        args[mode] = [wl("cpu_stage4_pd.yaml"), "--backend", "cpu", "--threads", "1", "--set",
                      "disaggregation.enabled=true", "--set", f"disaggregation.channel.kind={mode[3:]}"]
    s = Server(tandem, *args[mode])
    print(f"openai {openai.__version__} against tandem serve ({mode}) on port {s.port}")

    def ok(cond, what):
        if not cond:
            raise AssertionError(what)
        print(f"  ok: {what}")

    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="unused", max_retries=0, timeout=120)
        models = client.models.list()
        model = models.data[0].id
        ok(model, f"models.list(): {model}")

        r = client.completions.create(model=model, prompt="hello world", max_tokens=5, temperature=0)
        ok(r.usage.prompt_tokens == 11 and r.usage.completion_tokens == 5 and len(r.choices[0].text) == 5,
           f"completion: usage {r.usage.prompt_tokens}/{r.usage.completion_tokens}")
        r = client.completions.create(model=model, prompt=[3, 1, 4, 1, 5], max_tokens=4)
        ok(r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 4, "token-id prompt: usage exact")

        chunks, usage = [], None
        for c in client.completions.create(model=model, prompt="stream", max_tokens=7, stream=True,
                                           stream_options={"include_usage": True}):
            if c.choices:
                chunks.append(c.choices[0].text)
            if c.usage:
                usage = c.usage
        ok(len(chunks) == 7 and all(len(t) == 1 for t in chunks), "streamed completion: 7 one-token chunks")
        ok(usage and usage.prompt_tokens == 6 and usage.completion_tokens == 7, "streamed usage exact")

        msgs = [{"role": "system", "content": "short"}, {"role": "user", "content": [{"type": "text", "text": "hey"}]}]
        want_prompt = len("<|system|>\nshort\n<|user|>\nhey\n<|assistant|>\n".encode())
        r = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=3, temperature=0)
        ok(r.usage.prompt_tokens == want_prompt and r.usage.completion_tokens == 3 and
           len(r.choices[0].message.content) == 3, f"chat: usage {r.usage.prompt_tokens}/3")
        deltas, usage = [], None
        for c in client.chat.completions.create(model=model, messages=msgs, max_tokens=4, stream=True,
                                                stream_options={"include_usage": True}):
            if c.choices and c.choices[0].delta.content:
                deltas.append(c.choices[0].delta.content)
            if c.usage:
                usage = c.usage
        ok(len(deltas) == 4 and usage.completion_tokens == 4 and usage.prompt_tokens == want_prompt,
           "streamed chat: 4 deltas, usage exact")

        for kw, field in (({"temperature": 0.7}, "temperature"), ({"n": 2}, "n")):
            try:
                client.completions.create(model=model, prompt="x", max_tokens=2, **kw)
                ok(False, f"{field} refused")
            except openai.BadRequestError as e:
                ok(e.status_code == 400 and field in str(e), f"{field} refused: {e.body.get('message', '')[:60]}")

        stream = client.completions.create(model=model, prompt="leave", max_tokens=1000, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        m = wait_for(lambda: (lambda m: m if m.get("tandem:requests_cancelled_total", 0) >= 1 and
                              m["vllm:num_requests_running"] == 0 else None)(s.metrics()), 60, "the cancel")
        ok(m["tandem:requests_cancelled_total"] == 1, "a stream closed mid-way: cancelled, nothing running")
        if mode.startswith("pd-"):
            ok(m["tandem:kv_transfers_total"] > 0, f"KV transfers: {m['tandem:kv_transfers_total']:.0f}")
    finally:
        rc, _ = s.stop()
    ok(rc == 0, "SIGINT: exit 0")
    print("serve openai test: all checks passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    reexec_in_venv()
    sys.exit(main())
