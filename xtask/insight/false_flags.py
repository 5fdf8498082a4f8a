#!/usr/bin/env python3
# How often growth and diff flag what did not change: 20 (argv[1]) recordings of the
# lifecycle fixture (built by the tests: target/fixtures/lifecycle) and diffs of pairs of
# them. Needs root and a release build. Prints running counts.
import json, os, subprocess, sys, tempfile
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
A = os.path.join(ROOT, "target/release/allocscope")
FIX = os.path.join(ROOT, "target/fixtures/lifecycle")
LEAK = "leak_site"
TMP = tempfile.mkdtemp(prefix="false-flags-")
def record(out, variant):
    p = subprocess.run([A, "record", "--tick", "250ms", "-i", "64KiB", "-o", out, "--", FIX, os.path.join(TMP, "truths"), "4", variant],
                       input=b"go\n", capture_output=True)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return json.load(open(out))
runs = int(sys.argv[1])
flagged = checked = leak_flagged = leak_checked = 0
diff_flags = diff_checked = diff_runs_with_flag = 0
for r in range(runs):
    p = record(os.path.join(TMP, "a.json"), "a")
    for s in p["stacks"]:
        g = s.get("growth")
        if not g or not s["frames"]: continue
        leaf = s["frames"][0].get("function") or ""
        if leaf == LEAK:
            leak_checked += 1; leak_flagged += g["growing"]
        elif leaf.endswith("_site"):
            checked += 1; flagged += g["growing"]
    record(os.path.join(TMP, "b.json"), "a")
    d = subprocess.run([A, "diff", os.path.join(TMP, "a.json"), os.path.join(TMP, "b.json"), "-o", os.path.join(TMP, "d.json")], capture_output=True)
    dj = json.load(open(os.path.join(TMP, "d.json")))
    sig = [c for c in dj["stacks"] if c.get("alloc_change", {}).get("significant")]
    diff_checked += len(dj["stacks"]); diff_flags += len(sig); diff_runs_with_flag += bool(sig)
    print(f"run {r+1}: growth false flags {flagged}/{checked}, leak flagged {leak_flagged}/{leak_checked}; diff significant {diff_flags}/{diff_checked} comparisons, runs with any {diff_runs_with_flag}", flush=True)
