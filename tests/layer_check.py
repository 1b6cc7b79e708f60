#!/usr/bin/env python3
"""The include-layer check: a file may include project headers only from its own layer and the
layers below it (core < policies < backend < {backend/cuda, sim} < serve < the tandem executable).
The link-time check in meson.build sees calls upward; this one also sees header-only includes.

Usage: layer_check.py SOURCE_DIR       check the tree; exit 1 listing every upward include
       layer_check.py --self-test      plant an upward include in a scratch tree: must fail
"""
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
    "main": {"serve", "sim", "backend/cuda", "backend", "policies", "core"},  # sim/main.cpp: the executable
}
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def layer_of(rel):
    """The layer of a source file (path relative to the root), or of an included header."""
    if rel == "sim/main.cpp":
        return "main"
    if rel.startswith("backend/cuda/"):
        return "backend/cuda"
    top = rel.split("/", 1)[0]
    return top if top in ("core", "policies", "backend", "sim", "serve") else None


def check(root):
    problems = []
    for top in ("core", "policies", "backend", "sim", "serve"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                mine = layer_of(rel)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = layer_of(m.group(1))
                    if target is None:  # a header of the same folder, or generated (version.h)
                        continue
                    if target not in ALLOWED[mine]:
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{rel}:{line}: includes \"{m.group(1)}\": layer '{mine}' may include only "
                                        f"{', '.join(sorted(ALLOWED[mine]))}")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        for sub in ("core", "policies", "sim"):
            os.makedirs(os.path.join(d, sub))
        with open(os.path.join(d, "core", "time.h"), "w") as f:
            f.write("#pragma once\n")
        with open(os.path.join(d, "sim", "engine.h"), "w") as f:
            f.write('#include "policies/kv.h"\n#include "core/time.h"\n')
        with open(os.path.join(d, "policies", "kv.h"), "w") as f:
            f.write('#include "core/time.h"\n')
        if check(d):
            print("self-test: a clean tree was reported")
            return 1
        with open(os.path.join(d, "policies", "kv.h"), "a") as f:
            f.write('#include "sim/engine.h"\n')  # the planted upward include
        found = check(d)
        if len(found) != 1 or "policies/kv.h:2" not in found[0]:
            print(f"self-test: the planted upward include was not reported exactly once: {found}")
            return 1
        # serve/ sits above sim/: serve may include sim, sim may not include serve.
        os.makedirs(os.path.join(d, "serve"))
        with open(os.path.join(d, "serve", "frontend.h"), "w") as f:
            f.write('#include "sim/engine.h"\n')
        if len(check(d)) != 1:
            print("self-test: serve including sim was reported")
            return 1
        with open(os.path.join(d, "sim", "engine.h"), "a") as f:
            f.write('#include "serve/frontend.h"\n')  # sim reaching up into serve
        found = check(d)
        if len(found) != 2 or not any("sim/engine.h:3" in p for p in found):
            print(f"self-test: sim including serve was not reported: {found}")
            return 1
    print("self-test: planted upward includes (policies -> sim, sim -> serve) are reported")
    return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f"layer check: {len(problems)} upward include(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
