#!/usr/bin/env python3
"""sim/ in rooms by job: the table below says which room (a folder sim/ROOM/) holds each file of
sim/ and which other rooms a room's files may include; this script puts the tree in that shape.

Usage: tools/sim-rooms.py [--root DIR]            move every sim/ file into its room (git mv) and
                                                  rewrite the paths that name a moved file
       tools/sim-rooms.py [--root DIR] --dry-run  print the moves and the files it would rewrite
       tools/sim-rooms.py [--root DIR] --check    exit 1 if the tree differs from the table: a sim/
                                                  file in no room or in another room's folder, or a
                                                  table entry with no file
       tools/sim-rooms.py --self-test             move a scratch repository's sim/ by a small table:
                                                  paths rewritten where they are real, history left,
                                                  a second run changes nothing, --check sees a stray

A room lists stems: the stem `engine` is sim/ROOM/engine.h and sim/ROOM/engine.cpp, so a header
and its source stay together. Moving rewrites every real path that names a moved file
(`sim/engine.h` -> `sim/engine/engine.h`) in the sources (#include lines and comments), the
meson.build files (their quoted paths, relative to each file's folder), the tools, the tests,
README.md, CONTRIBUTING.md and reports/**/design.md (other reports are history and stay as they
were written). A file the table does not place stops the script before it moves anything. Run
twice, it changes nothing the second time. tests/layer_check.py reads the same table (load_table)
to hold each room to its arrows; the `sim-rooms` unit test runs --check.
Standard library only.
"""
import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile

# room: (its job, the rooms its files may include besides its own, its files by stem). Lowest
# rooms first; an arrow points only at a room above it in this table (check_table).
ROOMS = {
    "base": ("small readers and formatters every room may use: the YAML reader with positions, CSV, "
             "numbers, the host probe", [],
             ["yaml_reader", "csv", "parse_number", "number_format", "host_probe"]),
    "workload": ("the workload file and what follows from it: its types and parser (one file per section), "
                 "traces, the request generator, prompt block hashes, the prefix-hit bound", ["base"],
                 ["config", "config_sections", "config_workload", "config_model", "config_engine", "config_requests",
                  "config_disaggregation", "config_profile", "traces", "workload_gen", "prompt_hashes",
                  "prefix_bound"]),
    "engine": ("the loop: events, clocks, the inbox, instances, the topologies, metrics", ["workload", "base"],
               ["engine", "events", "clock", "inbox", "instance", "metrics", "topology", "topology_colocated",
                "topology_disaggregated", "topology_factory"]),
    "outputs": ("what a run writes: the schema, the writer, vllm_result.json, progress", ["engine", "workload",
                                                                                           "base"],
                ["outputs", "outputs_schema", "outputs_vllm", "progress"]),
    "remote": ("1P1D over tcp, the parent's side: the link to the worker, its channel and executor, the child "
               "process", ["engine", "workload"],
               ["worker_link", "worker_address", "worker_child", "remote_executor", "tcp_channel"]),
    "run": ("one way to set up a run: executors and channels for a workload, the threaded executor, RunSetup",
            ["remote", "outputs", "engine", "workload"], ["run_setup", "executors", "threaded_executor"]),
    "worker": ("`tandem worker`, the child's side: the server and its fault injection", ["run", "remote", "workload",
                                                                                         "base"],
               ["worker_server", "worker_faults"]),
    "calibrate": ("measuring a backend: the fit, the grid, refinement on served traffic, all-reduces, the channel",
                  ["run", "engine", "workload", "base"],
                  ["calibrate", "calibrate_serve", "calibrate_fit", "calibrate_grid", "calibrate_refine",
                   "calibrate_allreduce", "calibrate_channel"]),
    "sweep": ("many runs of one workload: the sweep file, capacity search, runs, results, vLLM's layout",
              ["run", "outputs", "engine", "workload", "base"],
              ["sweep_file", "sweep_search", "sweep_run", "sweep_results", "sweep_vllm"]),
    "commands": ("the tandem command: main.cpp and each subcommand's entry that is not its room's own",
                 ["sweep", "calibrate", "worker", "run", "remote", "outputs", "engine", "workload", "base"],
                 ["main", "calibrate_command", "sweep_command", "generate_command", "compare"]),
}
# Files that stay at sim/ itself: the build's list, and the template of the generated header
# sim/version.h (built into the build folder's sim/, so its include path names no room; any room
# may include it).
TOP_FILES = ["meson.build", "version.h.in"]
GENERATED = ["version"]

SOURCE_EXT = (".h", ".cpp", ".cu", ".cuh")


def load_table():
    """The table as plain data: {room: {"job", "uses", "stems"}}, the top-level files, the generated stems."""
    return ({room: {"job": job, "uses": list(uses), "stems": list(stems)} for room, (job, uses, stems) in ROOMS.items()},
            list(TOP_FILES), list(GENERATED))


def check_table(rooms):
    """Problems with the table itself: a stem in two rooms, an arrow to an unknown room or to one listed
    after it (so the arrows cannot form a cycle)."""
    problems, seen, order = [], {}, list(rooms)
    for i, (room, r) in enumerate(rooms.items()):
        for s in r["stems"]:
            if s in seen:
                problems.append(f"table: '{s}' is in rooms '{seen[s]}' and '{room}'")
            seen[s] = room
        for u in r["uses"]:
            if u not in rooms:
                problems.append(f"table: room '{room}' uses unknown room '{u}'")
            elif order.index(u) >= i:
                problems.append(f"table: room '{room}' uses '{u}', which is not below it")
    return problems


def stem_of(name):
    return name.split(".", 1)[0]


def room_of_stem(rooms):
    return {s: room for room, r in rooms.items() for s in r["stems"]}


def sim_files(root):
    """Every file under sim/, as paths relative to root."""
    out = []
    for dirpath, dirs, files in os.walk(os.path.join(root, "sim")):
        dirs.sort()
        for f in sorted(files):
            out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return out


def plan(root, rooms, top_files):
    """(moves {old: new}, problems): where each sim/ file belongs by the table."""
    where = room_of_stem(rooms)
    moves, problems, found = {}, [], set()
    for rel in sim_files(root):
        name = rel.rsplit("/", 1)[1]
        if rel == "sim/" + name and name in top_files:
            continue
        room = where.get(stem_of(name))
        if room is None:
            problems.append(f"{rel}: in no room of tools/sim-rooms.py's table (add its stem to a room)")
            continue
        found.add(stem_of(name))
        want = f"sim/{room}/{name}"
        if rel != want:
            moves[rel] = want
    for s, room in sorted(where.items()):
        if s not in found:
            problems.append(f"table: room '{room}' lists '{s}', but no sim/ file has that stem")
    if len(set(moves.values())) != len(moves):
        problems.append("two files would move to one place: " + ", ".join(sorted(moves)))
    return moves, problems


def text_files(root):
    """The tracked files whose paths are rewritten: sources, build files, tools, tests, and the
    README, CONTRIBUTING and design notes; never data, corpora, traces, workloads, other reports,
    this script or the layer check (both are written for either layout)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout.decode()
    out = []
    for rel in names.split("\0"):
        if not rel or not os.path.isfile(os.path.join(root, rel)):
            continue
        top = rel.split("/", 1)[0]
        if rel in ("tools/sim-rooms.py", "tests/layer_check.py"):
            continue
        if top in ("workloads", "traces") or rel.startswith(("tests/data/", "tests/fuzz/corpus/")):
            continue
        if top == "reports" and not rel.endswith("/design.md"):
            continue
        out.append(rel)
    return out


def rewrite_text(rel, text, moves):
    """`text` with every real path to a moved file renamed: a token sim/NAME (not inside a longer
    path) and, in a meson.build, a quoted path relative to its folder."""
    names = {old[len("sim/"):]: new for old, new in moves.items()}
    if names:
        token = re.compile(r"(?<![\w/.$-])sim/(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) +
                           r")(?![\w.-])")
        text = token.sub(lambda m: names[m.group(1)], text)
        # A stem's files together, as sim/engine.{h,cpp} or sim/engine.*: they move together.
        stems = {stem_of(old[len("sim/"):]): os.path.dirname(new) for old, new in moves.items()}
        group = re.compile(r"(?<![\w/.$-])sim/(" + "|".join(re.escape(s) for s in sorted(stems, key=len, reverse=True)) +
                           r")(\.\{[\w.,]+\}|\.\*)")
        text = group.sub(lambda m: f"{stems[m.group(1)]}/{m.group(1)}{m.group(2)}", text)
    if os.path.basename(rel) == "meson.build":
        here = os.path.dirname(rel)

        def quoted(m):
            path = os.path.normpath(os.path.join(here, m.group(2))).replace(os.sep, "/")
            if path not in moves:
                return m.group(0)
            return m.group(1) + os.path.relpath(moves[path], here or ".").replace(os.sep, "/") + m.group(1)

        text = re.sub(r"(['])([^'\n]+)\1", quoted, text)
    return text


def apply(root, moves, dry_run):
    rewrites = {}
    for rel in text_files(root):
        path = os.path.join(root, rel)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        new = rewrite_text(rel, text, moves)
        if new != text:
            rewrites[rel] = new
    for old, new in sorted(moves.items()):
        print(f"move {old} -> {new}")
    for rel in sorted(rewrites):
        print(f"rewrite {rel}")
    print(f"sim-rooms: {len(moves)} file(s) to move, {len(rewrites)} file(s) naming them to rewrite"
          + (" (dry run: nothing changed)" if dry_run else ""))
    if dry_run:
        return
    for old, new in sorted(moves.items()):
        os.makedirs(os.path.join(root, os.path.dirname(new)), exist_ok=True)
        subprocess.run(["git", "mv", old, new], cwd=root, check=True)
    for rel, text in rewrites.items():
        with open(os.path.join(root, moves.get(rel, rel)), "w", encoding="utf-8") as f:
            f.write(text)
    for dirpath, dirs, files in os.walk(os.path.join(root, "sim"), topdown=False):
        if not dirs and not files and dirpath != os.path.join(root, "sim"):
            os.rmdir(dirpath)


def self_test():
    """A scratch repository moved by a table of two rooms; returns the number of failed checks."""
    rooms = {"engine": {"job": "", "uses": [], "stems": ["engine", "events"]},
             "commands": {"job": "", "uses": ["engine"], "stems": ["main"]}}
    files = {
        "sim/engine.h": '#include "sim/events.h"\n',
        "sim/engine.cpp": '#include "sim/engine.h"\n// see sim/events.h; not sim/events.hpp nor $D/sim/engine.h\n',
        "sim/events.h": "#pragma once\n",
        "sim/main.cpp": '#include "sim/engine.h"\n#include "sim/version.h"\n',
        "sim/version.h.in": "#define V \"@VCS_TAG@\"\n",
        "sim/meson.build": "sim_src = files('engine.cpp')\nvcs_tag(input : 'version.h.in', output : 'version.h')\n",
        "meson.build": "subdir('sim')\nexecutable('t', 'sim/main.cpp')\n",
        "README.md": "The loop: `sim/engine.h` (and sim/engine.cpp); runs write DIR/sim/engine.h\n",
        "CONTRIBUTING.md": "sim/events.{h,cpp} and sim/engine.*, not sim/eng*\n",
        "reports/s1/design.md": "sim/events.h\n",
        "reports/s1/report.md": "sim/events.h, as it was then\n",
        "tests/t.cpp": '#include "sim/events.h"\n',
    }
    want = {
        "sim/engine/engine.h": '#include "sim/engine/events.h"\n',
        "sim/engine/engine.cpp": ('#include "sim/engine/engine.h"\n'
                                  "// see sim/engine/events.h; not sim/events.hpp nor $D/sim/engine.h\n"),
        "sim/commands/main.cpp": '#include "sim/engine/engine.h"\n#include "sim/version.h"\n',
        "sim/version.h.in": files["sim/version.h.in"],
        "sim/meson.build": "sim_src = files('engine/engine.cpp')\nvcs_tag(input : 'version.h.in', output : 'version.h')\n",
        "meson.build": "subdir('sim')\nexecutable('t', 'sim/commands/main.cpp')\n",
        "CONTRIBUTING.md": "sim/engine/events.{h,cpp} and sim/engine/engine.*, not sim/eng*\n",
        "README.md": "The loop: `sim/engine/engine.h` (and sim/engine/engine.cpp); runs write DIR/sim/engine.h\n",
        "reports/s1/design.md": "sim/engine/events.h\n",
        "reports/s1/report.md": files["reports/s1/report.md"],
        "tests/t.cpp": '#include "sim/engine/events.h"\n',
    }
    failed = 0

    def expect(ok, what):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok

    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=d, check=True,
                                        capture_output=True).stdout.decode()
        git("init", "-q")
        git("add", ".")
        git("commit", "-qm", "before")
        moves, problems = plan(d, rooms, TOP_FILES)
        expect(not problems and len(moves) == 4, f"the plan: 4 moves, no problems ({len(moves)}, {problems})")
        with contextlib.redirect_stdout(io.StringIO()):
            apply(d, moves, dry_run=False)
        for rel, text in want.items():
            path = os.path.join(d, rel)
            got = open(path).read() if os.path.exists(path) else None
            expect(got == text, f"{rel} after the move" + ("" if got == text else f": {got!r}"))
        expect(not os.path.exists(os.path.join(d, "sim", "engine.h")), "the old place is empty")
        renamed = sum(line.startswith("R") for line in git("status", "--porcelain").splitlines())
        expect(renamed == 4, f"git sees 4 renames ({renamed})")
        git("commit", "-qam", "moved")
        moves, problems = plan(d, rooms, TOP_FILES)
        with contextlib.redirect_stdout(io.StringIO()):
            apply(d, moves, dry_run=False)
        expect(not moves and not problems and git("status", "--porcelain") == "", "a second run changes nothing")
        with open(os.path.join(d, "sim", "stray.h"), "w") as f:
            f.write("#pragma once\n")
        with open(os.path.join(d, "sim", "engine", "main.h"), "w") as f:
            f.write("#pragma once\n")
        moves, problems = plan(d, rooms, TOP_FILES)
        expect(any("sim/stray.h: in no room" in p for p in problems), "--check: a file in no room")
        expect(moves == {"sim/engine/main.h": "sim/commands/main.h"}, f"--check: a file in another room ({moves})")
    bad = check_table({"a": {"uses": ["b"], "stems": ["x"]}, "b": {"uses": ["a"], "stems": ["x"]}})
    expect(len(bad) == 2, f"the table's checks: a stem in two rooms, an arrow upward ({bad})")
    print(f"sim-rooms self-test: {failed} failed")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage=argparse.SUPPRESS)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository (default: the one holding this script)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the moves and rewrites; change nothing")
    mode.add_argument("--check", action="store_true", help="exit 1 if any sim/ file is not where the table puts it")
    mode.add_argument("--self-test", action="store_true", help="move a scratch repository by a small table")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    rooms, top_files, _ = load_table()
    problems = check_table(rooms)
    moves, placed = plan(a.root, rooms, top_files)
    problems += placed
    for p in problems:
        print(p, file=sys.stderr)
    if a.check:
        for old, new in sorted(moves.items()):
            print(f"{old}: belongs in {new}", file=sys.stderr)
        n = sum(len(r["stems"]) for r in rooms.values())
        bad = len(problems) + len(moves)
        print(f"sim-rooms check: {len(rooms)} rooms, {n} stems; {bad} problem(s)")
        return 1 if bad else 0
    if problems:
        print("sim-rooms: nothing moved (fix the table first)", file=sys.stderr)
        return 1
    apply(a.root, moves, a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
