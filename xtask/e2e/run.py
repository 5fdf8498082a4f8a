#!/usr/bin/env python3
"""End-to-end slowdown on real programs (README, Cost): native, `record` (the in-process
front end, frees tracked, children followed), `record --alloc-only`, `record --no-preload` (uprobes on every
call) and heaptrack, interleaved rounds; each run's time against the native run of its
round, the median of those ratios with their range; then, from
the last round, each front end's exact count and estimate of the bytes allocated.

    sudo python3 xtask/e2e/run.py [ROUNDS]      (after cargo build --release)

Inputs are made in a fresh temporary directory: a 240,000-row sqlite3 insert batch, the
preprocessed C++ file (g++ -E big.cpp), and the Python and Perl scripts next to this file.
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
A = os.path.join(HERE, "..", "..", "target", "release", "allocscope")
CC1 = subprocess.run(["g++", "-print-prog-name=cc1plus"], capture_output=True, text=True,
                     check=True).stdout.strip()
work = tempfile.mkdtemp(prefix="allocscope-e2e-")
os.chdir(work)
shutil.copy(os.path.join(HERE, "script.py"), "script.py")
shutil.copy(os.path.join(HERE, "script.pl"), "script.pl")
subprocess.run(["g++", "-E", os.path.join(HERE, "big.cpp"), "-o", "big.ii"], check=True)
with open("batch.sql", "w") as f:
    f.write("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\nBEGIN;\n")
    for i in range(240000):
        f.write(f"INSERT INTO t(b,c) VALUES('row{i}-{'x' * (i % 50)}', {i * 0.5});\n")
    f.write("COMMIT;\nCREATE INDEX tb ON t(b);\n"
            "SELECT count(*), sum(length(b)) FROM t WHERE b LIKE '%7%';\n")
programs = {
    "python3 script.py (Debian 3.11)": (["/usr/bin/python3", "script.py"], None),
    "sqlite3 (240k inserts)": (["sqlite3", "test.db"], "batch.sql"),
    "perl script.pl": (["/usr/bin/perl", "script.pl"], None),
    "cc1plus -O1 (C++, <regex>)": ([CC1, "-quiet", "-O1", "big.ii", "-o", "/dev/null"], None),
    # The driver starts cc1plus and as: followed by default in-process; with --no-preload
    # only with --follow (file-wide uprobes), which that mode then gets here.
    "g++ -O1 -c (driver, cc1plus, as)": (["g++", "-O1", "-c", "big.ii", "-o", "big.o"], None),
}
modes = {
    "native": [],
    "record": [A, "record", "-o", "e2e.json", "--"],
    "record --alloc-only": [A, "record", "--alloc-only", "-o", "e2e.json", "--"],
    "record --no-preload": [A, "record", "--no-preload", "-o", "e2e.json", "--"],
    "heaptrack": ["heaptrack", "-o", os.path.join(work, "ht")],
}
compared = ["record", "record --no-preload"]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
times = {(p, m): [] for p in programs for m in modes}
failed = {}
counted = {}


def allocated():
    """The profile's processes: exact bytes, and the bytes estimate with its bounds."""
    with open("e2e.json") as f:
        processes = json.load(f)["processes"]
    exact = sum(p["exact"]["bytes"] for p in processes)
    est = [p["alloc_bytes"] for p in processes]
    upper = [e["upper"] for e in est]
    return (exact, sum(e["estimate"] for e in est), sum(e["lower"] for e in est),
            None if None in upper else sum(upper))


for r in range(rounds):
    for p, (cmd, stdin) in programs.items():
        for m, prefix in modes.items():
            if m == "heaptrack" and p.startswith("cc1plus") and r > 0:
                continue  # ~50 s a run, and heaptrack fails on it: once is enough
            for name in os.listdir(work):
                if name == "test.db" or name.startswith("ht."):
                    os.remove(name)
            inp = open(stdin) if stdin else subprocess.DEVNULL
            if p.startswith("g++") and m == "record --no-preload":
                prefix = prefix[:-1] + ["--follow", "--"]
            if p.startswith("g++") and m == "heaptrack" and r > 0:
                continue
            started = time.monotonic()
            rc = subprocess.run(prefix + cmd, stdin=inp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL).returncode
            times[(p, m)].append(time.monotonic() - started)
            if rc != 0:
                failed[(p, m)] = rc
            elif m in compared:
                counted[(p, m)] = allocated()
    print(f"round {r + 1} done", file=sys.stderr)
print("| program | " + " | ".join(modes) + " |")
print("|---|" + "---|" * len(modes))
for p in programs:
    natives = times[(p, "native")]
    cells = []
    for m in modes:
        ts = times[(p, m)]
        med = statistics.median(ts)
        # Each run against the native run of its own round (the VM's speed drifts between
        # rounds): the median of those ratios, and their range.
        ratios = [t / n for t, n in zip(ts, natives)]
        if m == "native":
            cell = f"{med:.2f} s ({min(ts):.2f}–{max(ts):.2f})"
        elif len(ts) == 1:
            cell = f"{ratios[0]:.2f}× (1 run)"
        else:
            cell = f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"
        if (p, m) in failed:
            cell += f", exit {failed[(p, m)]}"
        cells.append(cell)
    print(f"| {p} | " + " | ".join(cells) + " |")
print()
print("| program | " + " | ".join(f"{m}: exact, estimate [bounds]" for m in compared) + " |")
print("|---|" + "---|" * len(compared))
for p in programs:
    cells = []
    for m in compared:
        if (p, m) not in counted:
            cells.append("failed")
            continue
        exact, est, lower, upper = counted[(p, m)]
        mib = lambda b: f"{b / 2**20:.1f}"
        up = "∞" if upper is None else mib(upper)
        cells.append(f"{mib(exact)} MiB, {mib(est)} [{mib(lower)}, {up}]")
    print(f"| {p} | " + " | ".join(cells) + " |")
shutil.rmtree(work)
