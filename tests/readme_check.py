#!/usr/bin/env python3
"""Checks README.md against the tree and the built tandem, so that what a new user reads works.

Usage: readme_check.py SOURCE_DIR TANDEM

  paths      every repository path the README names in backticks or code blocks (workloads/,
             tools/, reports/, traces/, tests/, sim/, policies/, backend/, core/) exists
             (upper-case components such as TARGET and '*' are wildcards)
  quick      the first code block's first two commands name make targets and scripts that
             exist, and the block names the workload `make run` runs
  workloads  `tandem validate` accepts every workloads/*.yaml the README names (a sweep file under
             workloads/sweeps/: `tandem sweep plan` accepts it; a workload whose
             trace lies outside the tree and is absent is skipped); every profile it names
             validates with its own model; `tandem run` of the quickstart workload with
             --set requests.count=20 --quiet succeeds
  presets    the model and hardware preset tables list exactly the presets tandem knows, with
             the numbers `tandem validate --set model=NAME` (hardware=NAME) prints; the
             engine table's defaults are what `tandem validate` prints for a workload without
             an engine section
  commands   the Command line block names the subcommands `tandem --help` lists
  links      every relative link resolves (a file, and a heading for a #anchor); every
             "report, YYYY-MM-DD" attribution is a link to an existing file under reports/
             that mentions that date
  layout     every file in workloads/, workloads/bench/, workloads/profiles/ and tools/ is
             named in the Layout section
  help       `tandem CMD --help` exits 0 for every subcommand, and each option it lists is
             accepted by CMD (given alone, it is never "unrecognised" nor "an option of" another
             command); every `tools/` script the README names (in a code block or an inline span)
             is executable and its `--help` exits 0 within 30 s without doing anything else
  lines      every README command line naming `tandem CMD` or a `tools/` script uses only options
             that command's `--help` lists (so the line parses as written); a line whose script
             needs a GPU or a cluster (tools/device-*, ptx-check, hf-check, bench-torch.py,
             sweep-ray, slurm.sbatch, k8s) is counted as marked, not run: none of these checks
             runs a line's work
  blocks     every code block of command lines naming build/tandem or a tools/ script runs as
             written, its lines in order, in a scratch folder laid out as a fresh clone (the
             source's folders linked, build/tandem the binary under test); a `tandem worker` line
             runs in the background until the block ends (its port and /tmp paths replaced by a
             free port and the scratch folder); a block that starts a job with `&` (tandem serve,
             then curl and `kill %1`) runs as one script, as pasted into one shell; every line of an output block the README shows
             for a command (the next block, or one whose lead-in names the command in backticks)
             is in what it printed, lines naming wall-clock figures aside. Not run: make targets
             (CI runs make test itself), tools/setup (installs packages), the marked GPU/cluster
             scripts, build-fuzz/ replays, reproductions/reproduce (minutes; its own suite runs
             --check), and synopses (placeholders such as WORKLOAD.yaml)

Standard library only. Prints one line per failure and per check, then "N passed, N failed";
exits 1 on any failure, 2 on bad usage.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

PREFIXES = ("workloads", "tools", "reports", "traces", "tests", "sim", "policies", "backend", "core")
# A path the README may name before it exists: run.sh creates it with the first known finding.
MAY_BE_ABSENT = ("tests/fuzz/findings/",)
PATH_RE = re.compile(r"(?<![\w./~-])((?:%s)/[\w.*+/{},-]*)" % "|".join(PREFIXES))
FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE_RE = re.compile(r"`([^`\n]+)`")
LINK_RE = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
ATTRIB_RE = re.compile(r"report,\s+(\d{4}-\d{2}-\d{2})")
SKIP_DEFAULTS = {"derived", "none", "required", "see below", "file name"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class Checker:
    def __init__(self, src, tandem):
        self.src, self.tandem = src, tandem
        self.passed = self.failed = self.skipped = 0
        self.readme = read(os.path.join(src, "README.md"))

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {what}")
        return cond

    def skip(self, what):
        self.skipped += 1
        print(f"skip {what}")

    def run(self, args, timeout=60):
        try:
            p = subprocess.run([self.tandem] + args, cwd=self.src, capture_output=True, text=True, timeout=timeout)
            return p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            return 124, "", f"timed out after {timeout} s"

    # ---- helpers over the README ----
    def code_texts(self):
        """Fenced blocks and inline code spans (inline spans taken outside the fences)."""
        blocks = FENCE_RE.findall(self.readme)
        rest = FENCE_RE.sub("", self.readme)
        return blocks + INLINE_RE.findall(rest)

    def section(self, title):
        m = re.search(r"^## %s\n(.*?)(?=^## |\Z)" % re.escape(title), self.readme, re.M | re.S)
        return m.group(1) if m else ""

    def table_after(self, text, header_first_cell):
        """Rows (dicts by header) of the first table whose header's first cell is given."""
        lines = text.split("\n")
        for i, line in enumerate(lines):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and cells[0] == header_first_cell:
                rows = []
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    vals = [c.strip().strip("`") for c in row.strip().strip("|").split("|")]
                    rows.append(dict(zip(cells, vals)))
                return rows
        return None

    # ---- 1. paths ----
    def exists(self, path):
        path = path.rstrip(".,:;")
        if any(path.startswith(p) for p in MAY_BE_ABSENT):
            return True
        m = re.search(r"\{([^{}]*)\}", path)  # brace expansion: a.{h,cpp}
        if m:
            return all(self.exists(path[:m.start()] + alt + path[m.end():]) for alt in m.group(1).split(","))
        parts = ["*" if re.fullmatch(r"[A-Z][A-Z0-9_]*", c) else c for c in path.split("/")]
        pattern = os.path.join(self.src, *[p for p in parts if p])
        return bool(glob.glob(pattern))

    def check_paths(self):
        seen = set()
        for text in self.code_texts():
            for p in PATH_RE.findall(text):
                p = p.rstrip(".,:;")
                if p in seen or p.endswith("..."):
                    continue
                seen.add(p)
                self.ok(self.exists(p), f"paths: README names `{p}`, which does not exist")
        print(f"paths: {len(seen)} repository paths named")
        return seen

    # ---- 2. quick start ----
    def quickstart_workload(self):
        mk = read(os.path.join(self.src, "Makefile"))
        m = re.search(r"^WORKLOAD\s*\?=\s*(\S+)", mk, re.M)
        return (m.group(1) if m else "workloads/quickstart.yaml"), mk

    def check_quick(self):
        blocks = FENCE_RE.findall(self.readme)
        if not self.ok(blocks, "quick: the README has no code block"):
            return
        first = [l.split("#")[0].strip() for l in blocks[0].split("\n") if l.split("#")[0].strip()]
        self.ok(len(first) >= 2, "quick: the first code block has fewer than two commands")
        workload, mk = self.quickstart_workload()
        targets = set(re.findall(r"^([\w-]+):", mk, re.M))
        for cmd in first[:2]:
            for part in cmd.split("&&"):
                words = part.split()
                if words and words[0] == "make":
                    for t in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
                        self.ok(t in targets, f"quick: `{part.strip()}`: no make target '{t}'")
                elif words and words[0].startswith("tools/"):
                    f = os.path.join(self.src, words[0])
                    self.ok(os.path.isfile(f) and os.access(f, os.X_OK), f"quick: `{words[0]}` is not an executable file")
        self.ok(workload in blocks[0], f"quick: the first code block does not name {workload}, which `make run` runs")
        # The Quick start's package list is tools/setup's (the packages array), in full.
        setup = read(os.path.join(self.src, "tools", "setup"))
        m = re.search(r"^\s*packages=\(([^)]*)\)", setup, re.M)
        if self.ok(m, "quick: tools/setup has no packages=(...) list"):
            want = set(m.group(1).split())
            quick = self.section("Quick start")
            named = set(re.findall(r"[\w.+-]+", quick))
            self.ok(want <= named, f"quick: the Quick start omits tools/setup's packages {sorted(want - named)}")
        print(f"quick: {first[:2]}")

    # ---- 3. workloads ----
    def outside_trace_missing(self, wpath):
        """A path the workload reads that lies outside the tree and is absent (a public trace)."""
        text = read(wpath)
        for p in re.findall(r"\bpath:\s*([^,}\s]+)", text):
            full = os.path.normpath(os.path.join(os.path.dirname(wpath), p))
            if not full.startswith(os.path.normpath(self.src) + os.sep) and not os.path.exists(full):
                return full
        return None

    def named_workloads(self, paths):
        """workloads/... paths the README names, and the files of workloads/ (bench/, profiles/) it
        names by file name alone (as the Layout section does)."""
        named = {p for p in paths if p.startswith("workloads/") and p.endswith(".yaml") and "*" not in p}
        for d in ("workloads", "workloads/bench", "workloads/profiles"):
            for f in os.listdir(os.path.join(self.src, d)):
                if f.endswith(".yaml") and re.search(r"(?<![\w.-])%s(?![\w-])" % re.escape(f), self.readme):
                    named.add(f"{d}/{f}")
        return sorted(named)

    def check_workloads(self, paths):
        named = self.named_workloads(paths)
        for w in named:
            full = os.path.join(self.src, w)
            if not os.path.isfile(full):
                continue  # reported by paths
            if w.startswith("workloads/profiles/"):
                m = re.search(r"^\s+model:\s*(\S+)", read(full), re.M)
                if not m:
                    self.skip(f"workloads: {w}: no model recorded in the profile")
                    continue
                rc, _, err = self.run(["validate", self.quickstart_workload()[0], "--set", f"model={m.group(1)}",
                                       "--set", f"hardware={full}"])
                self.ok(rc == 0, f"workloads: profile {w} with model {m.group(1)}: exit {rc}: {err.strip()}")
                continue
            if w.startswith("workloads/sweeps/"):  # a sweep file: it must plan (every point loads)
                with tempfile.TemporaryDirectory() as tmp:
                    rc, _, err = self.run(["sweep", "plan", w, "--out", tmp])
                self.ok(rc == 0, f"workloads: tandem sweep plan {w}: exit {rc}: {err.strip()}")
                continue
            missing = self.outside_trace_missing(full)
            if missing:
                self.skip(f"workloads: {w}: {missing} is absent")
                continue
            rc, _, err = self.run(["validate", w])
            self.ok(rc == 0, f"workloads: tandem validate {w}: exit {rc}: {err.strip()}")
        q = self.quickstart_workload()[0]
        rc, _, err = self.run(["run", q, "--set", "requests.count=20", "--quiet"])
        self.ok(rc == 0, f"workloads: tandem run {q} --set requests.count=20 --quiet: exit {rc}: {err.strip()}")
        print(f"workloads: {len(named)} named, validated; {q} run with 20 requests")

    # ---- 4. presets and defaults ----
    @staticmethod
    def yaml_section(text, name):
        m = re.search(r"^%s:\n((?:[ \t]+.*\n)*)" % re.escape(name), text, re.M)
        return dict(re.findall(r"^  (\w+):\s*(.*?)\s*$", m.group(1), re.M)) if m else {}

    @staticmethod
    def same(a, b):
        try:
            return float(a.replace(",", "")) == float(b)
        except ValueError:
            return a.strip().lower() == b.strip().lower()

    def check_presets(self):
        q = self.quickstart_workload()[0]
        for kind in ("model", "hardware"):
            rows = self.table_after(self.readme, f"{kind} preset")
            if not self.ok(rows, f"presets: no table headed '{kind} preset'"):
                continue
            rc, _, err = self.run(["validate", q, "--set", f"{kind}=no-such-preset"])
            m = re.search(r"known: ([^;)]*)", err)
            known = [k.strip() for k in m.group(1).split(",")] if m else []
            listed = [r[f"{kind} preset"] for r in rows]
            self.ok(sorted(known) == sorted(listed), f"presets: {kind} table lists {listed}, tandem knows {known}")
            for r in rows:
                name = r[f"{kind} preset"]
                # A given cache: a model larger than the quickstart's one GPU (opt-175b, falcon-180b)
                # is checked for its shape, not for whether its weights fit that GPU.
                cache = ["--set", "engine.num_kv_blocks=4096"] if kind == "model" else []
                rc, out, err = self.run(["validate", q, "--set", f"{kind}={name}", *cache])
                if not self.ok(rc == 0, f"presets: validate --set {kind}={name}: exit {rc}: {err.strip()}"):
                    continue
                got = self.yaml_section(out, kind)
                for col, val in r.items():
                    if col in got:
                        self.ok(self.same(val, got[col]), f"presets: {kind} {name}: README {col} = {val}, tandem prints {got[col]}")
        # Engine defaults: a workload without an engine section.
        engine = self.readme.split("**engine**", 1)[1] if "**engine**" in self.readme else ""
        rows = self.table_after(engine, "key") or []
        self.ok(rows, "presets: no engine table after **engine**")
        with tempfile.TemporaryDirectory() as d:
            w = os.path.join(d, "defaults.yaml")
            with open(w, "w") as f:
                f.write("model: tiny\nhardware: h200\n"
                        "requests: {count: 1, arrival: {process: burst}, prompt_len: 8, output_len: 4}\n")
            rc, out, err = self.run(["validate", w])
        if self.ok(rc == 0, f"presets: validate of a workload without engine section: exit {rc}: {err.strip()}"):
            got = self.yaml_section(out, "engine")
            n = 0
            for r in rows:
                key, default = r.get("key", ""), r.get("default", "")
                if default in SKIP_DEFAULTS or key not in got:
                    continue
                n += 1
                self.ok(self.same(default, got[key]), f"presets: engine.{key}: README default {default}, tandem prints {got[key]}")
            self.ok(n >= 5, f"presets: only {n} engine defaults could be compared")
        print("presets: model and hardware tables, engine defaults compared with tandem validate")

    # ---- 5. subcommands ----
    def check_commands(self):
        block = FENCE_RE.findall(self.section("Command line"))
        readme_cmds = set(re.findall(r"^tandem (\w+)", block[0], re.M)) if block else set()
        rc, out, err = self.run(["--help"])
        tandem_cmds = set(re.findall(r"^\s*tandem (\w+)", out + err, re.M))
        self.ok(tandem_cmds and readme_cmds == tandem_cmds,
                f"commands: README lists {sorted(readme_cmds)}, `tandem --help` {sorted(tandem_cmds)}")
        print(f"commands: {sorted(readme_cmds)}")

    # ---- 6. links and attributions ----
    @staticmethod
    def slugs(md_text):
        """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-', duplicates -1, -2."""
        out, count = set(), {}
        for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", FENCE_RE.sub("", md_text), re.M):
            s = re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
            n = count.get(s, 0)
            count[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        return out

    def check_links(self):
        text = FENCE_RE.sub("", self.readme)
        own = self.slugs(self.readme)
        n = 0
        for label, target in LINK_RE.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            n += 1
            label = " ".join(label.split())
            path, _, anchor = target.partition("#")
            if not path:
                self.ok(anchor in own, f"links: [{label}](#{anchor}): no such heading in README")
                continue
            full = os.path.join(self.src, path)
            if not self.ok(os.path.exists(full), f"links: [{label}]({target}): {path} does not exist"):
                continue
            if anchor and path.endswith(".md"):
                self.ok(anchor in self.slugs(read(full)),
                        f"links: [{label}]({target}): no heading '#{anchor}' in {path}")
            dates = ATTRIB_RE.findall(label)
            for date in dates:
                self.ok(path.startswith("reports/"), f"links: attribution [{label}] points outside reports/: {target}")
                self.ok(date in read(full),
                        f"links: attribution [{label}]: {path} does not mention {date}")
        # An attribution must be a link: none may be left in plain text.
        plain = LINK_RE.sub("", text)
        for date in ATTRIB_RE.findall(plain):
            self.ok(False, f"links: 'report, {date}' is not a link to a report")
        print(f"links: {n} relative links, {len(ATTRIB_RE.findall(text))} dated attributions")

    # ---- 7. layout ----
    def check_layout(self):
        layout = self.section("Layout")
        self.ok(layout, "layout: no '## Layout' section")
        n = 0
        for d in ("workloads", "workloads/bench", "workloads/profiles", "tools"):
            for f in sorted(os.listdir(os.path.join(self.src, d))):
                full = os.path.join(self.src, d, f)
                if not os.path.isfile(full) or f.startswith(".") or f.endswith(".pyc"):
                    continue
                n += 1
                named = re.search(r"(?<![\w.-])%s(?![\w-])" % re.escape(f), layout)
                self.ok(named, f"layout: {d}/{f} is not named in the Layout section")
        print(f"layout: {n} files in workloads/ and tools/")


# Scripts whose work needs a GPU, a cluster or a torch install: their --help is checked, the rest
# of a line naming them is only parsed.
MARKED = ("tools/device-", "tools/ptx-check", "tools/ptx_entries.py", "tools/hf-check", "tools/bench-torch.py",
          "tools/sweep-ray", "tools/sweep/slurm.sbatch", "tools/sweep/k8s")
OPT_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


class HelpChecker:
    """`--help` of every tandem subcommand and every tools/ script the README names, and the
    options of the README's command lines against them."""

    def __init__(self, c):
        self.c = c
        self.helps = {}  # "tandem run" or "tools/plot" -> its --help text (None: it failed)

    @staticmethod
    def listed_options(text):
        """Options a --help lists: the option column of boost's and argparse's tables, and a usage
        line's brackets."""
        opts = set()
        for line in text.split("\n"):
            m = re.match(r"^\s+((?:-\w, )?--?[\w-]+(?:\s*\[?\s*(?:arg|[A-Z_,]+)\]?)?(?:, --?[\w-]+)?)", line)
            if m:
                opts |= set(OPT_RE.findall(m.group(1)))
            if "usage" in line.lower() or line.lstrip().startswith("[") or line.lstrip().startswith("tandem "):
                opts |= set(OPT_RE.findall(line))
        return opts

    def tandem_help(self, cmd):
        key = "tandem " + cmd
        if key not in self.helps:
            rc, out, err = self.c.run(cmd.split() + ["--help"])
            self.c.ok(rc == 0 and out.strip(), f"help: tandem {cmd} --help: exit {rc}: {err.strip()[:200]}")
            self.helps[key] = out if rc == 0 else None
        return self.helps[key]

    def script_help(self, script):
        if script not in self.helps:
            full = os.path.join(self.c.src, script)
            text = None
            if self.c.ok(os.path.isfile(full) and os.access(full, os.X_OK), f"help: {script} is not an executable file"):
                try:
                    p = subprocess.run([full, "--help"], cwd=self.c.src, capture_output=True, text=True, timeout=30,
                                       stdin=subprocess.DEVNULL)
                    rc, text = p.returncode, p.stdout + p.stderr
                except subprocess.TimeoutExpired:
                    rc, text = 124, ""
                self.c.ok(rc == 0 and text.strip(), f"help: {script} --help: exit {rc}: {text.strip()[-200:]}")
                text = text if rc == 0 else None
            self.helps[script] = text
        return self.helps[script]

    def check_tandem(self):
        rc, out, err = self.c.run(["--help"])
        cmds = sorted(set(re.findall(r"^\s*tandem (\w+)", out + err, re.M)))
        n = 0
        with tempfile.TemporaryDirectory() as tmp:
            w = os.path.join(self.c.src, self.c.quickstart_workload()[0])
            for cmd in cmds:
                text = self.tandem_help(cmd)
                if text is None:
                    continue
                for opt in sorted(self.listed_options(text) - {"-h", "--help"}):
                    # Alone (a placeholder value where it takes one), on the quickstart workload with
                    # two requests where the command takes a workload: never unknown to it.
                    takes_value = re.search(r"^\s+(?:-\w, )?%s (?:arg|\[)" % re.escape(opt), text, re.M)
                    args = [cmd] + ([w, "--set", "requests.count=2"] if cmd in ("run", "validate") else []) + [opt]
                    if takes_value:
                        args.append(os.path.join(tmp, "x") if opt == "--out" else "1")
                    refused = r"unrecogni[sz]ed option|is an option of|unknown option"
                    rc2, o2, e2 = self.c.run(args, timeout=120)
                    # An option of a subcommand the help names (`tandem sweep run DIR --index I`).
                    for sub in sorted(set(re.findall(r"tandem %s (\w+) " % cmd, text)) - {"WORKLOAD"}):
                        if not re.search(refused, o2 + e2):
                            break
                        rc2, o2, e2 = self.c.run([cmd, sub] + args[1:], timeout=120)
                    n += 1
                    self.c.ok(not re.search(refused, o2 + e2),
                              f"help: tandem {cmd} --help lists {opt}, which tandem {cmd} refuses: {e2.strip()[:200]}")
        print(f"help: {len(cmds)} subcommands' --help, {n} listed options tried")

    def references(self):
        """(line, where) for every README command line naming tandem or a tools/ script."""
        out = []
        for b in FENCE_RE.findall(self.c.readme):
            for line in b.split("\n"):
                out.append((line.split(" #")[0].strip(), "code block"))
        rest = FENCE_RE.sub("", self.c.readme)
        out += [(m, "inline") for m in INLINE_RE.findall(rest)]
        refs = []
        for line, where in out:
            for part in re.split(r"&&|\|(?!\w)|;", line):
                words = [w for w in part.split() if not re.match(r"^[A-Z_]+=", w)]
                if not words:
                    continue
                head = words[0].lstrip("./")
                if head in ("tandem", "build/tandem") and len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]):
                    refs.append(("tandem", words[1], words[2:], where))
                elif head.startswith("tools/") and not head.endswith((".yaml", "/", "*", "...")) and \
                        os.path.basename(head) != "tools":
                    refs.append(("script", head, words[1:], where))
        return refs

    def check_lines(self):
        n = marked = 0
        for kind, name, words, where in self.references():
            if kind == "tandem":
                sub = name
                if name == "sweep" and words and words[0] in ("plan", "run", "collect"):
                    sub = "sweep " + words[0]
                text = self.tandem_help(sub) if sub != "sweep run" else self.tandem_help("sweep")
                label = "tandem " + sub
            else:
                full = os.path.join(self.c.src, name)
                if not os.path.exists(full) or (name.endswith(".py") and not os.access(full, os.X_OK)):
                    continue  # reported by paths; a module run with python3 (test_tandem_tools.py) is no command
                text = self.script_help(name)
                label = name
                if name.startswith(MARKED):
                    marked += 1
            if text is None:
                continue
            n += 1
            opts = set(OPT_RE.findall(" ".join(w for w in words if not w.startswith(("'", '"')))))
            known = self.listed_options(text) | set(OPT_RE.findall(text))
            for opt in sorted(opts - known - {"-h", "--help"}):
                self.c.ok(False, f"lines: README ({where}) `{label} ... {opt}`: {label} --help does not list {opt}")
        print(f"lines: {n} README command lines checked against their --help ({marked} need a GPU or a cluster)")


class BlockRunner:
    """The README's command blocks run as written (#35): a user copies a block into a shell in a
    fresh clone; so does this, and compares what it printed with the output the README shows."""

    # make targets (CI runs make test), set-up, fuzz replays, the GPU/cluster scripts, and the
    # reproductions (minutes; the `reproductions` suite runs `reproductions/reproduce --check`).
    NOT_RUN = ("make ", "tools/setup", "build-fuzz/", "reproductions/") + MARKED
    VOLATILE = re.compile(r"wall|elapsed|\d s\)|seconds|ETA")

    def __init__(self, c):
        self.c = c

    @staticmethod
    def lines_of(block):
        """The block's command lines, continuations joined, trailing comments cut; comment lines
        kept (as None-free markers) so that '# terminal' notes are seen."""
        out, cur = [], ""
        for raw in block.split("\n"):
            line = raw.rstrip()
            if cur:
                cur += " " + line.strip()
            else:
                cur = line.strip()
            if cur.endswith("\\"):
                cur = cur[:-1].rstrip()
                continue
            if cur:
                out.append(cur if cur.startswith("#") else re.split(r"\s#\s", cur)[0].strip())
            cur = ""
        return out

    def runnable(self, line):
        if line.startswith("#") or line.startswith(self.NOT_RUN) or line.startswith("tandem "):
            return False
        if re.search(r"\b[A-Z][A-Z_]+(?:\.yaml|_DIR)\b|\[--|\.\.\.", line):  # a synopsis
            return False
        # The first word a command: build/tandem, or a tools/ file that exists (not the Layout
        # section's "tools/      setup; plot ..." listing).
        first = line.split()[0] if line.split() else ""
        return first == "build/tandem" or (first.startswith("tools/") and
                                            os.path.isfile(os.path.join(self.c.src, first)))

    def scratch(self, d):
        """A clone's layout in d: the source's tracked folders linked, build/tandem the binary."""
        for name in PREFIXES + ("README.md", "Makefile", "meson.build"):  # never runs/ or a build
            if os.path.exists(os.path.join(self.c.src, name)):
                os.symlink(os.path.join(self.c.src, name), os.path.join(d, name))
        os.makedirs(os.path.join(d, "build"))
        os.symlink(self.c.tandem, os.path.join(d, "build", "tandem"))

    def outputs_shown(self, blocks, i, cmds):
        """[(command, shown text)]: the output blocks after command block i: the next block when
        it holds no command, and each later one whose lead-in names one of cmds in backticks."""
        shown = []
        for j in range(i + 1, len(blocks)):
            start, end, text = blocks[j]
            if any(self.runnable(l) or l.startswith(("tandem ", "make ")) for l in self.lines_of(text)):
                break
            lead = self.c.readme[blocks[j - 1][1]:start]
            named = [cmd for cmd in cmds if "`%s`" % re.sub(r"^build/", "", cmd) in lead or "`%s`" % cmd in lead]
            if named:
                shown.append((named[0], text))
            elif j == i + 1 and len(lead.strip()) == 0:
                shown.append((None, text))  # right after the commands: what the block printed
            else:
                break
        return shown

    def check_blocks(self):
        blocks = [(m.start(), m.end(), m.group(1)) for m in FENCE_RE.finditer(self.c.readme)]
        ran = skipped = compared = 0
        for i, (start, _, text) in enumerate(blocks):
            lines = self.lines_of(text)
            cmds = [l for l in lines if self.runnable(l)]
            if not cmds:
                skipped += sum(1 for l in lines if l.startswith(self.NOT_RUN))
                continue
            where = "README:%d" % (self.c.readme.count("\n", 0, start) + 2)
            if any(l.endswith("&") for l in lines):
                ran += self.run_as_script(lines, where)
                continue
            printed = {}
            with tempfile.TemporaryDirectory(prefix="readme-block-") as d:
                self.scratch(d)
                port = free_port()
                servers = []
                try:
                    for line in lines:
                        if not self.runnable(line) and not (line.startswith("head ") or " > /tmp/" in line):
                            skipped += 0 if line.startswith("#") else 1
                            continue
                        cmd = re.sub(r"/tmp/", d + "/", line).replace("127.0.0.1:7001", "127.0.0.1:%d" % port)
                        if line.startswith("build/tandem worker "):
                            servers.append(self.start_server(cmd, d, where, line))
                            continue
                        ran += 1
                        try:
                            p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=d, capture_output=True,
                                               text=True, timeout=600, stdin=subprocess.DEVNULL)
                            rc, out, err = p.returncode, p.stdout, p.stderr
                        except subprocess.TimeoutExpired:
                            rc, out, err = 124, "", "timed out after 600 s"
                        self.c.ok(rc == 0, f"blocks: {where}: `{line}` exited {rc}: {err.strip()[-300:]}")
                        printed[line] = out + err
                finally:
                    for s in servers:
                        if s:
                            s.terminate()
                            s.wait(timeout=10)
            for cmd, shown in self.outputs_shown(blocks, i, cmds):
                out = printed.get(cmd) if cmd else "\n".join(printed.values())
                if not self.c.ok(out is not None, f"blocks: {where}: the README shows output for `{cmd}`, "
                                                  f"which the block did not run as written"):
                    continue
                have = {" ".join(l.split()) for l in out.split("\n")}
                for l in shown.split("\n"):
                    norm = " ".join(l.split())
                    if not norm or self.VOLATILE.search(norm):
                        continue
                    compared += 1
                    self.c.ok(norm in have, f"blocks: {where}: the README shows `{l.strip()[:120]}` for "
                                            f"{'`%s`' % cmd if cmd else 'the block'}; it printed no such line")
        print(f"blocks: {ran} README command lines run as written, {compared} shown output lines compared, "
              f"{skipped} not run (make targets, set-up, GPU or cluster scripts, reproductions)")

    def run_as_script(self, lines, where):
        """A block that starts a job in the background (`tandem serve ... &`, then `kill %1`):
        pasted into one shell as a user would, its every line in order, stopped at the first
        failing line; its port 8000 and /tmp paths replaced as for a worker. Returns the lines run."""
        cmds = [l for l in lines if not l.startswith("#")]
        with tempfile.TemporaryDirectory(prefix="readme-block-") as d:
            self.scratch(d)
            port = free_port()
            script = "set -e\n" + "\n".join(
                re.sub(r"/tmp/", d + "/", l).replace("127.0.0.1:8000", "127.0.0.1:%d" % port)
                .replace("localhost:8000", "localhost:%d" % port) for l in cmds) + "\n"
            # A server started in the background is given a moment to listen before the next line.
            script = re.sub(r"&\n", "&\nfor i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null && break; "
                                   "sleep 0.1; done\n" % port, script, count=1)
            try:
                p = subprocess.run(["bash", "-c", script], cwd=d, capture_output=True, text=True, timeout=300,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
                rc, err = p.returncode, p.stderr
            except subprocess.TimeoutExpired:
                rc, err = 124, "timed out after 300 s"
            self.c.ok(rc == 0, f"blocks: {where}: the block (run as one script) exited {rc}: {err.strip()[-400:]}")
        return len(cmds)

    def start_server(self, cmd, d, where, line):
        """A `tandem worker` line in the background, once it says it listens (or None)."""
        log = open(os.path.join(d, "server.out"), "w+")
        p = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=d, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        for _ in range(300):
            log.seek(0)
            if "listening on" in log.read():
                return p
            if p.poll() is not None:
                break
            time.sleep(0.1)
        log.seek(0)
        self.c.ok(False, f"blocks: {where}: `{line}` did not listen: {log.read().strip()[-300:]}")
        p.kill()
        return None


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    src, tandem = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    c = Checker(src, tandem)
    paths = c.check_paths()
    c.check_quick()
    c.check_workloads(paths)
    c.check_presets()
    c.check_commands()
    c.check_links()
    c.check_layout()
    h = HelpChecker(c)
    h.check_tandem()
    h.check_lines()
    BlockRunner(c).check_blocks()
    if c.skipped:
        print(f"{c.skipped} skipped")
    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
