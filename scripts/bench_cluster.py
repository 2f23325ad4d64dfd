#!/usr/bin/env python3
"""Several hdsd instances on one PostgreSQL under load: a benchmark, not a test.

    scripts/bench_cluster.py [--dataplanes 10000] [--window 60] [--bin target/release]
                             [--json OUT] [--port-base 26000]

What it does, in order:

1. A throwaway PostgreSQL cluster (Debian's postgresql: `initdb` and `pg_ctl`
   as the `postgres` user in a temporary directory, unix socket only, default
   durability settings: fsync and synchronous_commit on).
2. Three release hdsd instances on it (`store.kind = "postgres"`,
   `dataplanes.source = "api"`, `hds.report_interval = "5s"`, auth none).
3. `--dataplanes` definitions in three `gen-dataplanes` directories with the
   name prefixes a-, b-, c- (2 inbounds each), sent with `hdsd apply -f` to
   the first instance; it waits until every instance knows all of them.
4. Three `hdsd-loadgen run`, loadgen i against instance i with directory i:
   a third of the fleet per instance, every simulated Envoy reporting every
   5 s (all endpoints healthy).
5. Once every instance holds its third and one report interval has passed:
   a steady window of `--window` seconds, measuring per instance
   `hdsd_store_commits_total` (readiness write transactions) / window and
   hdsd's CPU (/proc utime+stime), the PostgreSQL server's CPU (the
   postmaster and every child alive at the window's end, /proc utime+stime;
   a child that exited during the window is not counted) and
   `pg_stat_database.xact_commit` (every committed transaction, reads too).
6. Failover: SIGKILL instance c (holding a third). Every loadgen lists all
   three instances, its own first, as an Envoy's bootstrap made with several
   `--server` does: c's simulated Envoys see their streams fail and move to
   a or b (another instance at random) after Envoy's backoff (jittered, up to
   1 s for the first attempt, doubling to 30 s). The seconds until a and b
   hold every dataplane include that backoff and the loadgen's own work; the
   survivors' CPU per reconnect (their CPU over the move, less their steady
   rate, per moved dataplane) is hdsd's share. Meanwhile every 200 ms it
   reads /metrics on the surviving instances a and b: the not-ready inbounds
   (every `hdsd_inbounds` status but `healthy` and `not_probed`) and the
   dataplanes each holds (`hdsd_dataplanes{connected="true"}`), until
   `cluster.instance_timeout` + `hds.stale_after` + 5 s after the kill (so
   the dead instance's sweep and any staleness it would cause are inside).
   Reattached = instances a and b hold every dataplane between them.

Prints one JSON object (and writes it to --json). Python 3 standard library.
"""

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
REPORT_INTERVAL_S = 5
INSTANCE_TIMEOUT_S = 10
STALE_AFTER_S = 3 * REPORT_INTERVAL_S
NOT_READY_FREE = ("healthy", "not_probed")


def log(*args):
    print("bench_cluster:", *args, file=sys.stderr, flush=True)


def cpu_s(pid):
    """utime + stime of one process, in seconds (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(ppid):
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid:
                out.append(int(p.name))
    return out


def metrics(api):
    """/metrics as {name{labels}: value} (comments dropped)."""
    with urllib.request.urlopen(f"http://{api}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def detail(api):
    """Every `hdsd_inbounds` status and `hdsd_store_*` series, as {series: value}."""
    return {k: v for k, v in metrics(api).items() if k.startswith(("hdsd_inbounds{", "hdsd_store_"))}


def fleet(api):
    """(dataplanes known, dataplanes held here, inbounds, not-ready inbounds, commits)."""
    m = metrics(api)
    known = sum(v for k, v in m.items() if k.startswith("hdsd_dataplanes{"))
    held = m.get('hdsd_dataplanes{connected="true"}', 0)
    inbounds = sum(v for k, v in m.items() if k.startswith("hdsd_inbounds{"))
    ready = sum(m.get(f'hdsd_inbounds{{status="{s}"}}', 0) for s in NOT_READY_FREE)
    return int(known), int(held), int(inbounds), int(inbounds - ready), m.get("hdsd_store_commits_total", 0)


class Postgres:
    def __init__(self, work):
        versions = sorted(Path("/usr/lib/postgresql").iterdir(), key=lambda p: int(p.name))
        self.bin = versions[-1] / "bin"
        self.dir = work / "pg"
        self.dir.mkdir()
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.data = self.dir / "data"
        self.as_pg(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        opts = (f"-c listen_addresses='' -c unix_socket_directories='{self.dir}' "
                "-c shared_buffers=128MB -c max_connections=100")
        self.as_pg(["pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"),
                    "-o", opts, "-w", "-t", "60", "start"])
        self.url = f"host={self.dir} user=postgres dbname=postgres"
        self.version = versions[-1].name

    def as_pg(self, argv):
        argv = ["runuser", "-u", "postgres", "--", str(self.bin / argv[0])] + argv[1:]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def postmaster(self):
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def cpu(self):
        pm = self.postmaster()
        return {pid: cpu_s(pid) for pid in [pm] + children(pm)}

    def xact_commit(self):
        out = subprocess.run([str(self.bin / "psql"), "-h", str(self.dir), "-U", "postgres", "-d", "postgres",
                              "-At", "-c", "select sum(xact_commit) from pg_stat_database"],
                             check=True, capture_output=True, text=True).stdout
        return int(out.strip())

    def stop(self):
        try:
            self.as_pg(["pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        except subprocess.CalledProcessError:
            pass


def wait_for(what, check, timeout, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(every)
    raise SystemExit(f"bench_cluster: timed out after {timeout}s waiting for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataplanes", type=int, default=10000)
    ap.add_argument("--window", type=float, default=60.0, help="steady window, seconds")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release"))
    ap.add_argument("--port-base", type=int, default=26000)
    ap.add_argument("--json")
    args = ap.parse_args()
    binary = Path(args.bin)
    work = Path(tempfile.mkdtemp(prefix="hdsd-cluster-"))
    os.chmod(work, 0o755)
    procs = []
    pg = None
    try:
        pg = Postgres(work)
        log(f"PostgreSQL {pg.version} up")
        names = ["a", "b", "c"]
        shares = [args.dataplanes // 3] * 3
        shares[0] += args.dataplanes - sum(shares)
        hds = [f"127.0.0.1:{args.port_base + 10 * i}" for i in range(3)]
        api = [f"127.0.0.1:{args.port_base + 10 * i + 2}" for i in range(3)]
        hdsd = []
        for i, n in enumerate(names):
            d = work / n
            d.mkdir()
            (d / "hdsd.toml").write_text(f"""state_dir = "{d}/state"
[hds]
listen = "{hds[i]}"
report_interval = "{REPORT_INTERVAL_S}s"
[hds.limits]
max_connections = 100000
max_connections_per_ip = 100000
[api]
listen = "{api[i]}"
[dataplanes]
source = "api"
[store]
kind = "postgres"
[store.postgres]
url = "{pg.url}"
[cluster]
instance_timeout = "{INSTANCE_TIMEOUT_S}s"
[auth]
mode = "none"
""")
            p = subprocess.Popen([str(binary / "hdsd"), "serve", "--config", str(d / "hdsd.toml")],
                                 stdout=open(d / "hdsd.log", "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            hdsd.append(p)
        for i in range(3):
            wait_for(f"instance {names[i]} /readyz",
                     lambda i=i: urllib.request.urlopen(f"http://{api[i]}/readyz", timeout=2).status == 200, 120)
        dirs = []
        for i, n in enumerate(names):
            d = work / n / "dataplanes"
            subprocess.run([str(binary / "hdsd-loadgen"), "gen-dataplanes", "--count", str(shares[i]),
                            "--inbounds", "2", "--prefix", f"{n}-", "--dir", str(d)],
                           check=True, stdout=subprocess.DEVNULL)
            dirs.append(d)
        t = time.monotonic()
        for d in dirs:
            subprocess.run([str(binary / "hdsd"), "apply", "-f", str(d), "--api", f"http://{api[0]}"],
                           check=True, stdout=subprocess.DEVNULL)
        apply_s = time.monotonic() - t
        for i in range(3):
            wait_for(f"instance {names[i]} to know {args.dataplanes} dataplanes",
                     lambda i=i: fleet(api[i])[0] == args.dataplanes, 300, every=1)
        log(f"{args.dataplanes} definitions applied in {apply_s:.1f}s and seen by every instance")

        loadgens = []
        for i in range(3):
            out = open(work / names[i] / "loadgen.json", "w")
            servers = ",".join([hds[i]] + [h for j, h in enumerate(hds) if j != i])
            p = subprocess.Popen([str(binary / "hdsd-loadgen"), "run", "--hds", servers, "--api", f"http://{api[i]}",
                                  "--server-pid", str(hdsd[i].pid), "--dataplanes-dir", str(dirs[i]),
                                  "--sample", "0", "--duration", f"{int(args.window)}s", "--linger", "3600s",
                                  "--json", "--label", f"cluster-{names[i]}"],
                                 stdout=out, stderr=open(work / names[i] / "loadgen.log", "w"))
            procs.append(p)
            loadgens.append(p)
        t = time.monotonic()
        for i in range(3):
            wait_for(f"instance {names[i]} to hold {shares[i]} streams",
                     lambda i=i: fleet(api[i])[1] == shares[i] and loadgens[i].poll() is None, 600, every=1)
        connect_s = time.monotonic() - t
        log(f"every instance holds its third ({connect_s:.1f}s); warming up one report interval")
        time.sleep(REPORT_INTERVAL_S + 1)

        # The steady window.
        load_before = os.getloadavg()
        c0 = [fleet(a)[4] for a in api]
        h0 = [cpu_s(p.pid) for p in hdsd]
        pg0 = pg.cpu()
        x0 = pg.xact_commit()
        t0 = time.monotonic()
        time.sleep(args.window)
        c1 = [fleet(a)[4] for a in api]
        h1 = [cpu_s(p.pid) for p in hdsd]
        pg1 = pg.cpu()
        x1 = pg.xact_commit()
        window = time.monotonic() - t0
        steady_fleet = [fleet(a) for a in api]
        steady_detail = {n: detail(api[i]) for i, n in enumerate(names)}
        load_after = os.getloadavg()
        pg_cpu = sum(v - (pg0.get(pid) or 0) for pid, v in pg1.items() if v is not None)
        steady = {
            "window_s": round(window, 1),
            "write_tx_per_s": {n: round((c1[i] - c0[i]) / window, 2) for i, n in enumerate(names)},
            "hdsd_cpu_pct": {n: round(100 * (h1[i] - h0[i]) / window, 1) for i, n in enumerate(names)},
            "postgres_cpu_pct": round(100 * pg_cpu / window, 1),
            "postgres_processes": len(pg1),
            "postgres_xact_commit_per_s": round((x1 - x0) / window, 1),
            "not_ready_inbounds_at_end": {n: steady_fleet[i][3] for i, n in enumerate(names)},
            "metrics_at_end": steady_detail,
            "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        }
        log("steady:", json.dumps(steady))

        # Failover: instance c dies with a third of the fleet.
        survivors = [0, 1]
        samples = []
        stop = threading.Event()
        worst_seen = {}

        def sample():
            while not stop.is_set():
                t = time.monotonic()
                row = {"t": t}
                for i in survivors:
                    try:
                        f = fleet(api[i])
                        row[names[i]] = {"held": f[1], "not_ready": f[3], "known": f[0]}
                        if f[3] > 0 and f[3] >= worst_seen.get(i, (0, None))[0]:
                            worst_seen[i] = (f[3], detail(api[i]))
                    except OSError as e:
                        row[names[i]] = {"error": str(e)}
                samples.append(row)
                stop.wait(max(0.0, 0.2 - (time.monotonic() - t)))

        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(1)
        kill_t = time.monotonic()
        cpu_at_kill = [cpu_s(hdsd[i].pid) for i in survivors]
        hdsd[2].send_signal(signal.SIGKILL)
        wait_for(f"instances a and b to hold all {args.dataplanes} streams",
                 lambda: sum(fleet(api[i])[1] for i in survivors) == args.dataplanes, 300, every=0.2)
        reattached_s = time.monotonic() - kill_t
        cpu_moved = sum(cpu_s(hdsd[i].pid) - cpu_at_kill[k] for k, i in enumerate(survivors))
        steady_rate = sum((h1[i] - h0[i]) / window for i in survivors)
        cpu_us_per_reconnect = max(0.0, cpu_moved - steady_rate * reattached_s) / shares[2] * 1e6
        log(f"every dataplane held by a or b {reattached_s:.2f}s after the kill; sampling until the sweep and staleness")
        time.sleep(max(0.0, kill_t + INSTANCE_TIMEOUT_S + STALE_AFTER_S + 5 - time.monotonic()))
        stop.set()
        sampler.join()
        worst = {names[i]: max((s[names[i]].get("not_ready", 0) for s in samples if s["t"] >= kill_t), default=0)
                 for i in survivors}
        errors = sum(1 for s in samples for i in survivors if "error" in s[names[i]])
        failover = {
            "killed": "c",
            "moved_dataplanes": shares[2],
            "reattached_s": round(reattached_s, 2),
            "survivors_cpu_us_per_reconnect": round(cpu_us_per_reconnect, 1),
            "held_after_move": {names[i]: fleet(api[i])[1] for i in survivors},
            "samples": sum(1 for s in samples if s["t"] >= kill_t),
            "sample_errors": errors,
            "sampled_for_s": round(samples[-1]["t"] - kill_t, 1),
            "max_not_ready_inbounds": worst,
            "worst_sample_metrics": {names[i]: v[1] for i, v in worst_seen.items()},
            "not_ready_before_kill": {names[i]: [s[names[i]].get("not_ready") for s in samples if s["t"] < kill_t]
                                      for i in survivors},
            "held_at_end": {names[i]: samples[-1][names[i]].get("held") for i in survivors},
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        log("failover:", json.dumps(failover))
        loadgen_results = {}
        for i, n in enumerate(names):
            try:
                loadgen_results[n] = json.loads((work / n / "loadgen.json").read_text().splitlines()[0])
            except (OSError, IndexError, ValueError):
                loadgen_results[n] = None
        result = {
            "dataplanes": args.dataplanes,
            "inbounds_per_dataplane": 2,
            "instances": 3,
            "report_interval_s": REPORT_INTERVAL_S,
            "nproc": os.cpu_count(),
            "postgres": pg.version,
            "apply_s": round(apply_s, 1),
            "connect_s": round(connect_s, 1),
            "steady": steady,
            "failover": failover,
            "loadgens": loadgen_results,
        }
        print(json.dumps(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result) + "\n")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if pg is not None:
            pg.stop()
        if os.environ.get("KEEP_WORK") == "1":
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
