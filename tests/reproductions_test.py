#!/usr/bin/env python3
"""The reproductions of published tables (reproductions/) as a regression guard.

Usage: reproductions_test.py SOURCE_DIR TANDEM

  guard     `reproductions/reproduce --check` passes: every reproduction's error against the paper
            is within the band recorded in reproductions/bounds.json (reports/reproductions/report.md
            says how each was measured)
  mutation  the guard can fail: the same check with the A100's matrix rate 20 % lower
            (--set hardware.peak_tflops=199.68) must exit 1 and name the errors that moved

The capacity reproduction needs ../shared/traces/etalon (ShareGPT lengths); without it that
reproduction is skipped and said so. Standard library only. Exit 0 ok, 1 failure, 77 skipped.
"""
import os
import subprocess
import sys

SHAREGPT = "shared/traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    src, tandem = argv[1], os.path.abspath(argv[2])
    script = os.path.join(src, "reproductions", "reproduce")
    names = ["sarathi-fig2", "sarathi-table2", "sarathi-fig9a", "splitwise-hardware"]
    if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(src)), SHAREGPT)):
        names.append("sarathi-capacity")
    else:
        print("skip: sarathi-capacity (no ../%s)" % SHAREGPT)
    failed = 0

    def run(extra):
        return subprocess.run([sys.executable, script, "--tandem", tandem, "--check"] + extra,
                              capture_output=True, text=True, timeout=600)

    r = run(names)
    print(r.stdout)
    if r.returncode != 0:
        print("FAIL guard: reproduce --check exit %d\n%s" % (r.returncode, r.stderr))
        failed += 1
    else:
        print("ok guard: %s within their recorded bands" % ", ".join(names))

    # The mutation: the fast reproductions with a 20 % slower matrix rate.
    m = run(["sarathi-table2", "sarathi-fig9a", "--set", "hardware.peak_tflops=199.68"])
    moved = [l for l in m.stdout.splitlines() if l.startswith("  sarathi-")]
    if m.returncode != 1 or "FAILED" not in m.stdout or not moved:
        print("FAIL mutation: peak_tflops -20 %% should fail the guard; exit %d\n%s\n%s" % (
            m.returncode, m.stdout, m.stderr))
        failed += 1
    else:
        print("ok mutation: peak_tflops -20 %% fails the guard (%d errors left their band), e.g.\n%s" % (
            len(moved), "\n".join(moved[:3])))
    print("%d passed, %d failed" % (2 - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
