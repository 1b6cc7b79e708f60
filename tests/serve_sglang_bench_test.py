#!/usr/bin/env python3
"""SGLang's bench_serving (a benchmark client nobody here wrote) against `tandem serve --backend sim`,
through tools/sglang-bench: 24 requests of its random dataset at 12/s. Checks that the client
completed every request, that tandem served exactly those (plus the client's warm-up), that the
client's token counts (it counts with the tokenizer `tandem serve --write-tokenizer` wrote) equal
the server's, and that what the client measured agrees with tandem's record of the same requests:
TPOT means within 25 %, and the client's TTFT p50 no lower than the server's (the loopback and the
client's own work come on top). Skips (77) without .venv-sglang-bench (tools/setup --sglang-bench).

Usage: serve_sglang_bench_test.py TANDEM SOURCE_DIR
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from serve_helpers import check, run_bench_client_tool  # noqa: E402


def main():
    tandem, src = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        t = run_bench_client_tool("sglang-bench", tandem, src, tmp, "--num-prompts", "24",
                                  "--request-rate", "12", "--input-len", "256", "--output-len", "32")
        if t is None:
            return 77
        check(t["completed"] == 24, f"the client completed {t['completed']} of 24 requests")
        check(t["served_finished"] == 24 + t["served_warmup_requests"] and t["served_warmup_requests"] >= 0,
              f"tandem finished {t['served_finished']}: the 24 and {t['served_warmup_requests']} warm-up")
        check(t["client_input_tokens"] == t["served_prompt_tokens"],
              f"prompt tokens: the client counted {t['client_input_tokens']}, tandem served {t['served_prompt_tokens']}")
        check(t["client_output_tokens"] == t["served_output_tokens"],
              f"output tokens: the client counted {t['client_output_tokens']}, tandem served "
              f"{t['served_output_tokens']}")
        rows = {r["metric"]: r for r in t["rows"]}
        client, served = rows["TPOT sglang bench_serving"], rows["TPOT tandem served (record)"]
        check(abs(client["mean"] - served["mean"]) <= 0.25 * served["mean"],
              f"TPOT mean: the client {client['mean']:.2f} ms, tandem's record {served['mean']:.2f} ms")
        client, served = rows["TTFT sglang bench_serving"], rows["TTFT tandem served (record)"]
        check(client["p50"] >= served["p50"],
              f"TTFT p50: the client {client['p50']:.2f} ms >= tandem's record {served['p50']:.2f} ms")
    print("serve-sglang-bench: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
