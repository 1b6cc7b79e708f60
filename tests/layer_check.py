#!/usr/bin/env python3
"""The include checks: layers, sim/'s rooms, and cycles.

  layers  a file may include project headers only from its own layer and the layers below it
          (core < policies < backend < {backend/cuda, sim} < serve < the tandem executable). The
          link-time check in meson.build sees calls upward; this one also sees header-only includes.
  rooms   inside sim/, a file may include only its own room's files and those of the rooms its room
          names: the table of tools/sim-rooms.py (ROOMS), read from there, one source of truth. A
          file is placed by its stem through that table, so the check holds before and after the move.
  cycles  no two files include each other, directly or around a loop. A file and its header count
          as one unit (sim/engine.h + sim/engine.cpp): a cycle is a loop of units, as when
          calibrate.cpp includes calibrate_serve.h, which includes calibrate.h.

Usage: layer_check.py SOURCE_DIR       check the tree; exit 1 listing every problem
       layer_check.py --self-test      plant an upward include, a forbidden room arrow and a cycle
                                       in a scratch tree: each must be reported
"""
import importlib.util
import os
import re
import sys
import tempfile

# Which project directories each layer may include from (its own first).
ALLOWED = {
    "core": {"core"},
    "policies": {"policies", "core"},
    "backend": {"backend", "policies", "core"},
    "backend/cuda": {"backend/cuda", "backend", "policies", "core"},
    "sim": {"sim", "backend", "policies", "core"},
    "serve": {"serve", "sim", "backend", "policies", "core"},  # tandem serve's front end
    "main": {"serve", "sim", "backend/cuda", "backend", "policies", "core"},  # sim's main.cpp: the executable
}
TOPS = ("core", "policies", "backend", "sim", "serve")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def layer_of(rel):
    """The layer of a source file (path relative to the root), or of an included header."""
    if rel.startswith("sim/") and rel.endswith("/main.cpp"):
        return "main"
    if rel.startswith("backend/cuda/"):
        return "backend/cuda"
    top = rel.split("/", 1)[0]
    return top if top in TOPS else None


def load_rooms(root):
    """tools/sim-rooms.py's table: ({room: {"uses", "stems", ...}}, top-level files, generated stems)."""
    spec = importlib.util.spec_from_file_location("sim_rooms", os.path.join(root, "tools", "sim-rooms.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.load_table()


def sources(root):
    """(path relative to root, text, [(line, included path)]) of every source file of the layers."""
    out = []
    for top in TOPS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                incs = [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INCLUDE.finditer(text)]
                out.append((rel, incs))
    return out


def check_layers(files):
    problems = []
    for rel, incs in files:
        mine = layer_of(rel)
        for line, inc in incs:
            target = layer_of(inc)
            if target is None:  # a header of the same folder, or generated (version.h)
                continue
            if target not in ALLOWED[mine]:
                problems.append(f"{rel}:{line}: includes \"{inc}\": layer '{mine}' may include only "
                                f"{', '.join(sorted(ALLOWED[mine]))}")
    return problems


def stem_of(path):
    return path.rsplit("/", 1)[-1].split(".", 1)[0]


def check_rooms(files, table):
    """A sim/ file's includes of sim/ files of another room: only along its room's arrows."""
    rooms, _, generated = table
    where = {s: room for room, r in rooms.items() for s in r["stems"]}
    problems = []
    for rel, incs in files:
        if not rel.startswith("sim/"):
            continue
        mine = where.get(stem_of(rel))
        if mine is None:
            problems.append(f"{rel}: in no room of tools/sim-rooms.py's table")
            continue
        for line, inc in incs:
            if not inc.startswith("sim/") or stem_of(inc) in generated:
                continue
            target = where.get(stem_of(inc))
            if target is None:
                problems.append(f"{rel}:{line}: includes \"{inc}\", which is in no room")
            elif target != mine and target not in rooms[mine]["uses"]:
                allowed = ", ".join(rooms[mine]["uses"]) or "none"
                problems.append(f"{rel}:{line}: includes \"{inc}\": room '{mine}' may not include room '{target}' "
                                f"(its arrows: {allowed}; tools/sim-rooms.py)")
    return problems


def check_cycles(files):
    """Loops of units (a header and its source: the path without its extension) through includes."""
    graph, how = {}, {}
    for rel, incs in files:
        unit = os.path.splitext(rel)[0]
        graph.setdefault(unit, set())
        for line, inc in incs:
            target = os.path.splitext(inc)[0]
            if target != unit:
                graph[unit].add(target)
                how.setdefault((unit, target), f"{rel}:{line}")
    # Tarjan's strongly connected components, iteratively (no recursion limit on a long chain).
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    problems = []
    for comp in sorted(comps):
        edges = sorted(how[(a, b)] + f" -> {b}" for a in comp for b in graph[a] if b in comp)
        problems.append(f"include cycle between {', '.join(comp)}: " + "; ".join(edges))
    return problems


def check(root, table=None):
    files = sources(root)
    return check_layers(files) + check_rooms(files, table or load_rooms(root)) + check_cycles(files)


def write(d, rel, text, mode="w"):
    os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
    with open(os.path.join(d, rel), mode) as f:
        f.write(text)


def self_test():
    # A table of three rooms: engine <- outputs, and run on both.
    table = ({"engine": {"uses": [], "stems": ["engine", "events"]},
              "outputs": {"uses": ["engine"], "stems": ["outputs"]},
              "run": {"uses": ["outputs", "engine"], "stems": ["run_setup"]}}, ["meson.build"], ["version"])
    with tempfile.TemporaryDirectory() as d:
        write(d, "core/time.h", "#pragma once\n")
        write(d, "sim/engine/engine.h", '#include "policies/kv.h"\n#include "core/time.h"\n#include "sim/version.h"\n')
        write(d, "sim/engine/events.h", '#include "core/time.h"\n')
        write(d, "sim/engine/engine.cpp", '#include "sim/engine/engine.h"\n#include "sim/engine/events.h"\n')
        write(d, "sim/outputs/outputs.h", '#include "sim/engine/engine.h"\n')
        write(d, "sim/run/run_setup.cpp", '#include "sim/outputs/outputs.h"\n#include "sim/engine/events.h"\n')
        write(d, "policies/kv.h", '#include "core/time.h"\n')
        if check(d, table):
            print(f"self-test: a clean tree was reported: {check(d, table)}")
            return 1
        write(d, "policies/kv.h", '#include "sim/engine/engine.h"\n', "a")  # the planted upward include
        found = check(d, table)
        if not any("policies/kv.h:2" in p and "layer" in p for p in found):
            print(f"self-test: the planted upward include was not reported: {found}")
            return 1
        write(d, "policies/kv.h", '#include "core/time.h"\n')
        # serve/ sits above sim/: serve may include sim, sim may not include serve.
        write(d, "serve/frontend.h", '#include "sim/engine/engine.h"\n')
        if check(d, table):
            print("self-test: serve including sim was reported")
            return 1
        write(d, "sim/engine/events.h", '#include "serve/frontend.h"\n', "a")  # sim reaching up into serve
        found = check(d, table)
        if not any("sim/engine/events.h:2" in p and "layer 'sim'" in p for p in found):
            print(f"self-test: sim including serve was not reported: {found}")
            return 1
        write(d, "sim/engine/events.h", '#include "core/time.h"\n')
        # A forbidden room arrow: engine (the lowest room) reaching up into outputs.
        write(d, "sim/engine/events.h", '#include "sim/outputs/outputs.h"\n', "a")
        found = check(d, table)
        arrows = [p for p in found if "room 'engine' may not include room 'outputs'" in p]
        if len(arrows) != 1 or "sim/engine/events.h:2" not in arrows[0]:
            print(f"self-test: the forbidden room arrow engine -> outputs was not reported once: {found}")
            return 1
        # ... which is also a cycle: outputs -> engine -> events -> outputs.
        cycles = [p for p in found if p.startswith("include cycle")]
        if len(cycles) != 1 or "sim/outputs/outputs" not in cycles[0] or "sim/engine/events" not in cycles[0]:
            print(f"self-test: the cycle outputs -> engine -> events -> outputs was not reported once: {found}")
            return 1
        write(d, "sim/engine/events.h", '#include "core/time.h"\n')
        # A cycle inside one room, which no arrow forbids: engine.cpp includes events.h, and
        # events.h includes engine.h (a header and its source are one unit).
        write(d, "sim/engine/events.h", '#include "sim/engine/engine.h"\n', "a")
        found = check(d, table)
        if len(found) != 1 or not found[0].startswith("include cycle between sim/engine/engine, sim/engine/events"):
            print(f"self-test: the pair engine <-> events was not reported alone: {found}")
            return 1
        write(d, "sim/engine/events.h", '#include "core/time.h"\n')
        # A file whose stem the table does not place.
        write(d, "sim/engine/stray.h", "#pragma once\n")
        found = check(d, table)
        if len(found) != 1 or "sim/engine/stray.h: in no room" not in found[0]:
            print(f"self-test: a file in no room was not reported: {found}")
            return 1
    print("self-test: planted problems are reported: upward includes (policies -> sim, sim -> serve), a forbidden "
          "room arrow (engine -> outputs), include cycles (across rooms and inside one), a file in no room")
    return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    files = sources(root)
    table = load_rooms(root)
    layers, rooms, cycles = check_layers(files), check_rooms(files, table), check_cycles(files)
    for p in layers + rooms + cycles:
        print(p)
    units = len({os.path.splitext(rel)[0] for rel, _ in files})
    print(f"layer check: {len(files)} files; {len(layers)} upward include(s), {len(rooms)} room problem(s) "
          f"({len(table[0])} rooms), {len(cycles)} include cycle(s) among {units} units")
    return 1 if layers or rooms or cycles else 0


if __name__ == "__main__":
    sys.exit(main())
