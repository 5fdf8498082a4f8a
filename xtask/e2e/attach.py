#!/usr/bin/env python3
"""Attaching to a running process (README, Cost): redis-server driven by redis-benchmark,
native against `record -p` (the in-process sampler loaded into it, frees tracked),
`record -p --front-end uprobes` (a trap on every call) and `heaptrack -p` (gdb loads its
library), in interleaved rounds; each run's requests per second against the native run of
its round, the median of those ratios with their range. Then sqlite3, perl and python3
attached 0.3 s into a long workload until it exits: wall time against native, and the
profile's estimate of the bytes allocated against its exact count.

    sudo python3 xtask/e2e/attach.py [ROUNDS]      (after cargo build --release)
"""
import json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
A = os.path.join(HERE, "..", "..", "target", "release", "allocscope")
work = tempfile.mkdtemp(prefix="allocscope-attach-")
os.chdir(work)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
PORT = "16379"


def redis():
    server = subprocess.Popen(["redis-server", "--port", PORT, "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", PORT, "ping"], capture_output=True).stdout.strip() == b"PONG":
            return server
        time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def throughput():
    out = subprocess.run(["redis-benchmark", "-p", PORT, "-P", "8", "-q", "-n", "400000",
                          "-t", "set,get,lpush,lpop,sadd,hset"],
                         capture_output=True, text=True, check=True).stdout
    rates = [float(x) for x in re.findall(r"([0-9.]+) requests per second", out)]
    return statistics.mean(rates)


def started(argv, ready):
    """Starts a recorder/profiler; returns it once `ready` (a predicate of its stderr so far)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = ""
    deadline = time.monotonic() + 60
    while not ready(said):
        line = p.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise SystemExit(f"{argv[0]} did not start: {said[-500:]}")
        said += line
    return p


modes = {
    "native": None,
    "record -p": lambda pid: started([A, "record", "-v", "-p", str(pid), "-o", "r.json"],
                                     lambda s: "recording pid" in s),
    "record -p --front-end uprobes": lambda pid: started(
        [A, "record", "-p", str(pid), "--front-end", "uprobes", "-o", "u.json"],
        lambda s: "recording pid" in s),
    "heaptrack -p": lambda pid: started(["heaptrack", "-p", str(pid), "-o", os.path.join(work, "ht")],
                                        lambda s: "injecting heaptrack" in s.lower() or "heaptrack output will be written" in s.lower()),
}
rates = {m: [] for m in modes}
stops = []
for r in range(rounds):
    for mode, start in modes.items():
        server = redis()
        throughput()  # warm up
        recorder = start(server.pid) if start else None
        if mode == "heaptrack -p":
            time.sleep(3)  # gdb attaches and loads the library after its message
        rate = throughput()
        if mode == "heaptrack -p":
            # heaptrack -p records until its target exits.
            server.terminate()
            server.wait(timeout=30)
            recorder.communicate(timeout=300)
        elif recorder:
            recorder.send_signal(signal.SIGINT)
            err, _ = recorder.communicate(timeout=120)
            stops += re.findall(r"stopped ([0-9.]+) ms", err)
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        rates[mode].append(rate)
        print(f"round {r + 1} {mode}: {rate:,.0f} requests/s", file=sys.stderr, flush=True)

print("| redis-server (redis-benchmark -P 8) | requests/s | vs native (median [range]) |")
print("|---|---|---|")
for mode in modes:
    ratios = [x / n for x, n in zip(rates[mode], rates["native"])]
    print(f"| {mode} | {statistics.median(rates[mode]):,.0f} | {statistics.median(ratios):.2f}× "
          f"[{min(ratios):.2f}, {max(ratios):.2f}] |")
if stops:
    print(f"\nthread stopped to load the sampler: {', '.join(stops)} ms")

# Processes attached while they run.
with open("batch.sql", "w") as f:
    f.write("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\nBEGIN;\n")
    for i in range(400000):
        f.write(f"INSERT INTO t(b,c) VALUES('row{i}-{'x' * (i % 50)}', {i * 0.5});\n")
    f.write("COMMIT;\nCREATE INDEX tb ON t(b);\n")
shutil.copy(os.path.join(HERE, "script.py"), "script.py")
shutil.copy(os.path.join(HERE, "script.pl"), "script.pl")
programs = {
    "sqlite3 (400k inserts)": (["sqlite3", "test.db"], "batch.sql"),
    "perl script.pl": (["/usr/bin/perl", "script.pl"], None),
    "python3 script.py": (["/usr/bin/python3", "script.py"], None),
}


def run(argv, stdin, attach):
    if os.path.exists("test.db"):
        os.unlink("test.db")
    started_at = time.monotonic()
    with open(stdin) if stdin else open(os.devnull) as inp:
        p = subprocess.Popen(argv, stdin=inp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        recorder = None
        if attach:
            time.sleep(0.3)
            recorder = subprocess.Popen([A, "record", "-p", str(p.pid), "-o", "p.json", *attach],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        p.wait()
        took = time.monotonic() - started_at
        if recorder:
            recorder.wait(timeout=120)
    return took


print("\n| attached 0.3 s in, until it exits | vs native, in-process (median [range]) | uprobes | estimate vs exact (in-process) |")
print("|---|---|---|---|")
for name, (argv, stdin) in programs.items():
    ratios = {"in": [], "up": []}
    for _ in range(rounds):
        native = run(argv, stdin, None)
        ratios["in"].append(run(argv, stdin, ["--front-end", "in-process"]) / native)
        with open("p.json") as f:
            processes = json.load(f)["processes"]
        ratios["up"].append(run(argv, stdin, ["--front-end", "uprobes"]) / native)
    exact = sum(p["exact"]["bytes"] for p in processes)
    est = processes[0]["alloc_bytes"] if processes else {"estimate": 0, "lower": 0, "upper": 0}
    inside = est["lower"] <= exact <= est["upper"]
    fmt = lambda xs: f"{statistics.median(xs):.2f}× [{min(xs):.2f}, {max(xs):.2f}]"
    print(f"| {name} | {fmt(ratios['in'])} | {fmt(ratios['up'])} | {est['estimate'] / 2**20:.1f} MiB "
          f"[{est['lower'] / 2**20:.1f}, {est['upper'] / 2**20:.1f}] vs {exact / 2**20:.1f} MiB "
          f"({'inside' if inside else 'OUTSIDE'}) |")
shutil.rmtree(work, ignore_errors=True)
