#!/usr/bin/env python3
"""The agent's soak (README, "The agent over time"): `allocscope agent --all` for MINUTES
while real programs run, pushing every period to a Pyroscope-like endpoint on 127.0.0.1
(which counts what it receives); the agent's RSS and CPU time are read every 10 s.

    sudo python3 xtask/soak/run.py [MINUTES] [PERIOD_SECONDS]   (after cargo build --release)

Writes, in target/soak/: rss.csv (seconds, rss_bytes, cpu_seconds, periods, pushed) and
rss.svg (the RSS over time), and prints whether every period was pushed.
"""
import csv, http.server, json, os, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
A = os.path.join(ROOT, "target", "release", "allocscope")
OUT = os.path.join(ROOT, "target", "soak")
minutes = float(sys.argv[1]) if len(sys.argv) > 1 else 30
period = int(sys.argv[2]) if len(sys.argv) > 2 else 60
os.makedirs(OUT, exist_ok=True)
work = tempfile.mkdtemp(prefix="allocscope-soak-")

received = {"requests": 0, "bytes": 0}


class Push(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        received["requests"] += 1
        received["bytes"] += len(body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Push)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}"
status = os.path.join(work, "status.json")
agent = subprocess.Popen([A, "agent", "--all", "--period", f"{period}s", "--pyroscope", url,
                          "--spool-dir", os.path.join(work, "spool"), "--status", status],
                         stderr=open(os.path.join(OUT, "agent.log"), "w"))

# Real programs, over and over: short ones (many processes come and go), and longer ones.
with open(os.path.join(work, "batch.sql"), "w") as f:
    f.write("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\nBEGIN;\n")
    for i in range(20000):
        f.write(f"INSERT INTO t(b) VALUES('row{i}');\n")
    f.write("COMMIT;\nCREATE INDEX tb ON t(b);\n")
programs = [
    ["/usr/bin/python3", os.path.join(ROOT, "xtask", "e2e", "script.py")],
    ["/usr/bin/perl", os.path.join(ROOT, "xtask", "e2e", "script.pl")],
    ["sh", "-c", f"sqlite3 {work}/db.sqlite < {work}/batch.sql; rm -f {work}/db.sqlite"],
    ["sh", "-c", "for i in $(seq 50); do ls /usr/lib > /dev/null; date > /dev/null; done"],
    ["g++", "-O0", "-c", "-x", "c++", "-o", "/dev/null", "-"],
]
stop = threading.Event()


def churn():
    i = 0
    while not stop.is_set():
        command = programs[i % len(programs)]
        stdin = subprocess.PIPE if command[0] == "g++" else subprocess.DEVNULL
        p = subprocess.Popen(command, stdin=stdin, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=work)
        if stdin == subprocess.PIPE:
            p.communicate(b"#include <map>\n#include <string>\nstd::map<int,std::string> m;\n")
        p.wait()
        i += 1
        time.sleep(0.5)


threading.Thread(target=churn, daemon=True).start()
rows = []
start = time.time()
page = os.sysconf("SC_PAGE_SIZE")
hz = os.sysconf("SC_CLK_TCK")
while time.time() - start < minutes * 60 and agent.poll() is None:
    time.sleep(10)
    try:
        rss = int(open(f"/proc/{agent.pid}/statm").read().split()[1]) * page
        fields = open(f"/proc/{agent.pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / hz
    except OSError:
        break
    s = json.load(open(status)) if os.path.exists(status) else {}
    pushed = s.get("sinks", [{}])[0].get("pushed", 0)
    rows.append((round(time.time() - start), rss, cpu, s.get("periods", 0), pushed))
    print(f"{rows[-1][0]:5d} s  rss {rss / 2**20:6.1f} MiB  cpu {cpu:6.1f} s  "
          f"periods {rows[-1][3]}  pushed {pushed}", flush=True)
stop.set()
agent.terminate()
agent.wait(timeout=60)
final = json.load(open(status))
with open(os.path.join(OUT, "rss.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["seconds", "rss_bytes", "cpu_seconds", "periods", "pushed"])
    w.writerows(rows)

# The SVG: RSS (MiB) over minutes.
W, H, PAD = 640, 240, 40
tmax = max(r[0] for r in rows) or 1
ymax = max(r[1] for r in rows) / 2**20 * 1.25
pts = " ".join(f"{PAD + r[0] / tmax * (W - 2 * PAD):.1f},{H - PAD - r[1] / 2**20 / ymax * (H - 2 * PAD):.1f}"
               for r in rows)
ticks = "".join(
    f'<text x="{PAD - 6}" y="{H - PAD - v / ymax * (H - 2 * PAD) + 4:.1f}" text-anchor="end">{v:.0f}</text>'
    for v in [ymax / 1.25 * k / 4 for k in range(5)])
svg = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">allocscope agent --all: RSS (MiB) over {tmax / 60:.0f} minutes, {final['periods']} periods, {final['sinks'][0]['pushed']} pushed</text>
<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#888"/>
<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#888"/>
{ticks}
<text x="{W / 2}" y="{H - 8}" text-anchor="middle">minutes (0–{tmax / 60:.0f})</text>
<polyline fill="none" stroke="#c0392b" stroke-width="2" points="{pts}"/>
</svg>
"""
open(os.path.join(OUT, "rss.svg"), "w").write(svg)
first, last = rows[len(rows) // 10], rows[-1]
print(json.dumps({"periods": final["periods"], "pushed": final["sinks"][0]["pushed"],
                  "dropped": final["sinks"][0]["dropped"], "samples_lost": final["samples_lost"],
                  "requests_received": received["requests"], "bytes_received": received["bytes"],
                  "rss_mib_at_10pct": round(first[1] / 2**20, 1),
                  "rss_mib_at_end": round(last[1] / 2**20, 1),
                  "cpu_seconds": last[2]}, indent=1))
