#!/usr/bin/env python3
"""Checks on a 1P1D run's files for the fault cases of tests/cli_test.sh (stage 4, issue #32).
Each prints one line and exits 1 when the check fails.

  pd_check.py ended RUN ROWS REASON...      requests.csv has ROWS rows, each finished, cancelled,
                                            or failed with one of the REASONs (and a finish time)
  pd_check.py tokens COLO RUN               every request RUN finished, COLO finished with the same
                                            output tokens (at least one finished)
  pd_check.py transfers RUN KEY=N ...       summary.json's disaggregation.transfers: started,
                                            delivered, failed, error, corrupt, partial, timed_out,
                                            and "delivered+failed=started" or "KEY>0"
  pd_check.py cancels RUN PHASE=N ...       summary.json's disaggregation.cancels (prefill, parked,
                                            transfer, received, decode): prints them all; checks those named
  pd_check.py orders RUN STEP_DELAY_MS      from requests.csv and steps.csv: transfers during which
                                            a decode step's reply came in (the next step started in the
                                            transfer's window, the one before it earlier: a StepReply
                                            before the transfer's KvAck), and transfers that ended while
                                            a decode step was in flight (a KvAck before the StepReply;
                                            a step lasts its measured time plus the worker's
                                            injected delay); prints both counts
"""
import csv
import json
import sys


def rows(run):
    with open(f"{run}/requests.csv", newline="") as f:
        return list(csv.DictReader(f))


def transfers(run):
    with open(f"{run}/summary.json") as f:
        d = json.load(f)["disaggregation"]
    t = dict(d["transfers"])
    t.update(t.pop("failed_by_cause"))
    return t, d["cancels"]


def ended(run, n, reasons):
    bad, counts = [], {}
    rs = rows(run)
    for r in rs:
        s = r["status"]
        key = s if s != "failed" else f"failed:{r['fail_reason']}"
        counts[key] = counts.get(key, 0) + 1
        if s not in ("finished", "cancelled", "failed") or r["finish_s"] == "":
            bad.append(f"request {r['id']}: status {s!r}, finish_s {r['finish_s']!r}")
        elif s == "failed" and r["fail_reason"] not in reasons:
            bad.append(f"request {r['id']}: failed with {r['fail_reason']!r}")
    print(f"    {run}: {len(rs)} rows: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}")
    for b in bad[:5]:
        print("    " + b)
    return not bad and len(rs) == n


def tokens(colo, run):
    want = {r["id"]: r["output_tokens"] for r in rows(colo) if r["status"] == "finished"}
    got = [r for r in rows(run) if r["status"] == "finished"]
    same = sum(1 for r in got if r["output_tokens"] and want.get(r["id"]) == r["output_tokens"])
    print(f"    {run}: {same} of {len(got)} finished requests have the colocated tokens")
    return len(got) > 0 and same == len(got)


def check_transfers(run, terms):
    t, _ = transfers(run)
    print(f"    {run}: transfers " + ", ".join(f"{k} {t[k]}" for k in
          ("started", "delivered", "failed", "error", "corrupt", "partial", "timed_out", "aborted")))
    ok = True
    for term in terms:
        if term == "delivered+failed=started":
            good = t["delivered"] + t["failed"] == t["started"]
        elif term.endswith(">0"):
            good = t[term[:-2]] > 0
        else:
            k, v = term.split("=")
            good = t[k] == int(v)
        if not good:
            print(f"    not {term}")
            ok = False
    return ok


def cancels(run, terms):
    _, c = transfers(run)
    print(f"    {run}: cancels " + ", ".join(f"{k} {c[k]}" for k in ("prefill", "parked", "transfer", "received", "decode")))
    wrong = [t for t in terms if c[t.split("=")[0]] != int(t.split("=")[1])]
    if wrong:
        print(f"    not {', '.join(wrong)}")
    return not wrong


def orders(run, step_delay_ms):
    steps = []
    with open(f"{run}/steps.csv", newline="") as f:
        for s in csv.DictReader(f):
            if s["instance"] == "1":
                start = float(s["start_s"])
                steps.append((start, start + (float(s["elapsed_ms"]) + step_delay_ms) / 1e3))
    windows = [(float(r["transfer_start_s"]), float(r["transfer_end_s"])) for r in rows(run)
               if r["transfer_start_s"] and r["transfer_end_s"]]
    # D runs one step at a time and plans the next when a reply comes in, so a step that starts in
    # the window after one that started before it follows a reply that came in the window.
    replies_first = sum(1 for a, b in windows
                        if any(steps[k][0] < a < steps[k + 1][0] < b for k in range(len(steps) - 1)))
    acks_in_step = sum(1 for a, b in windows if any(s < b < e for s, e in steps))
    print(f"    {run}: {len(windows)} transfers: {replies_first} outlived a decode step's reply, "
          f"{acks_in_step} ended while a decode step was in flight")
    return replies_first, acks_in_step


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ended":
        sys.exit(0 if ended(args[0], int(args[1]), args[2:]) else 1)
    if cmd == "tokens":
        sys.exit(0 if tokens(args[0], args[1]) else 1)
    if cmd == "transfers":
        sys.exit(0 if check_transfers(args[0], args[1:]) else 1)
    if cmd == "cancels":
        sys.exit(0 if cancels(args[0], args[1:]) else 1)
    if cmd == "orders":
        r, a = orders(args[0], float(args[1]))
        sys.exit(0)
    sys.exit(f"unknown check {cmd}")
