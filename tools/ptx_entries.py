#!/usr/bin/env python3
"""Which CUDA kernels compile to other code: the PTX of each kernel entry, before and after.

    tools/ptx_entries.py OLD.ptx NEW.ptx      (tools/ptx-check runs it per .cu file)

Without a GPU, the way to show that a change leaves a verified kernel alone is to show that
the kernel's compiled code did not change. PTX is what nvcc hands ptxas; two entries with the
same PTX give the same machine code. Names and labels that move with unrelated edits are
normalised: the anonymous namespace's per-file hash ("_GLOBAL__N__<hash>_<n>_<file>_cu_<hash>")
and the basic-block labels ("$L__BB<function>_<n>", numbered by the function's position in the
file). Prints SAME / CHANGED / GONE / NEW per entry; exit 1 if any entry changed or went.
"""
import re
import sys

ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}")
LABEL = re.compile(r"\$L__BB\d+_")
ENTRY = re.compile(r"^(?:\.visible )?\.entry (\S+)\(", re.M)


def entries(text):
    """{normalised entry name: normalised PTX of the entry} of one PTX file."""
    text = LABEL.sub("$L__BB_", ANON.sub("ANON", text))
    out = {}
    for m in ENTRY.finditer(text):
        end = text.find("\n}\n", m.start())
        out[m.group(1)] = text[m.start():end if end >= 0 else len(text)]
    return out


def compare(old, new):
    """[(verdict, name)], verdict one of SAME, CHANGED, GONE, NEW."""
    rows = []
    for name in sorted(old):
        rows.append(("GONE" if name not in new else "SAME" if old[name] == new[name] else "CHANGED", name))
    rows += [("NEW", name) for name in sorted(set(new) - set(old))]
    return rows


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) != 2:
        print(__doc__.split("\n")[2].strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        old = entries(f.read())
    with open(argv[1]) as f:
        new = entries(f.read())
    rows = compare(old, new)
    for verdict, name in rows:
        print(f"{verdict:<8} {name}")
    return 1 if any(v in ("CHANGED", "GONE") for v, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
