#!/usr/bin/env python3
"""Several hdsd instances on one PostgreSQL under load: a benchmark, not a test.

    scripts/bench_cluster.py [--instances 3] [--dataplanes 10000] [--window 60]
                             [--latency-window 30] [--latency-sample 10]
                             [--source-ips 64] [--bin target/release] [--json OUT]
                             [--port-base 26000] [--report-interval 5] [--instance-timeout 10]

What it does, in order:

1. A throwaway PostgreSQL cluster (Debian's postgresql: `initdb` and `pg_ctl`
   as the `postgres` user in a temporary directory, unix socket only, default
   durability settings: fsync and synchronous_commit on, `max_connections`
   300).
2. `--instances` hdsd instances on it, named a, b, c, ... (`store.kind =
   "postgres"`, `dataplanes.source = "api"`, `hds.report_interval` 5 s,
   auth none; `hds.limits.max_connections` and `max_connections_per_ip` set
   for an instance's share after one instance died: the fleet over the
   instances but one, plus 5 %). Each one's RSS once it is ready (empty).
3. `--dataplanes` definitions in one `gen-dataplanes` directory per instance
   (name prefixes a-, b-, ...; 2 inbounds each), each directory sent with
   `hdsd apply -f` to its own instance, all at once. Loading them is set-up,
   not measured: PostgreSQL runs with `synchronous_commit = off` until every
   instance knows every definition, then back on (reloaded) for the rest.
   Each instance's RSS then (the fleet's definitions, no stream).
4. One `hdsd-loadgen run` per instance, loadgen i with directory i, listing
   every instance with its own first (as an Envoy's bootstrap made with
   several `--server` does), its connections spread over `--source-ips`
   loopback addresses; every simulated Envoy reports every interval (all
   endpoints healthy). Instance a's loadgen starts last: before it, instance
   a holds no stream but knows the whole fleet's definitions and the
   readiness of every other instance's share (RSS: the fleet view); after
   it, instance a holds its share (RSS: held streams). Memory per dataplane
   not held = (a's fleet-view RSS - a's empty RSS) / dataplanes; memory per
   held dataplane = (a's RSS holding its share - its fleet-view RSS) / its
   share. The same two differences for every instance (empty -> definitions
   known -> holding its share) are in the JSON too.
5. Report at a -> visible at the observer (instance e, or b with fewer than
   six instances): a's loadgen flips `--latency-sample` of its dataplanes at
   every report for `--latency-window` seconds (after one report interval),
   and polls the observer's API for each flip (`GET
   /api/v1/dataplanes/...`, every 0.25-1 ms, up to 3 s) from the moment
   the report was sent: the loadgen's `readiness_propagation` (p50/p99,
   timeouts). Then the flips stop and every instance must read 0 inbounds
   not ready before the steady window.
6. A steady window of `--window` seconds, measuring per instance
   `hdsd_store_commits_total` (readiness write transactions) / window,
   hdsd's CPU (/proc utime+stime) and RSS; the PostgreSQL server's CPU (the
   postmaster and every child alive at the window's end, /proc
   utime+stime; a child that exited during the window is not counted), its
   memory (RSS of the postmaster, and the sum of every process's PSS, which
   counts shared buffers once) and `pg_stat_database.xact_commit` (every
   committed transaction, reads too).
7. Failover: SIGKILL of the last instance (holding its share). Every
   loadgen lists all instances: the dead one's simulated Envoys see their
   streams fail and move to another instance at random after Envoy's
   backoff (jittered, up to 1 s for the first attempt, doubling to 30 s).
   The seconds until the survivors hold every dataplane include that backoff
   and the loadgen's own work; the survivors' CPU per reconnect (their CPU
   over the move, less their steady rate, per moved dataplane) is hdsd's
   share. Meanwhile every 200 ms it reads /metrics on every survivor: the
   not-ready inbounds (every `hdsd_inbounds` status but `healthy` and
   `not_probed`) and the dataplanes each holds
   (`hdsd_dataplanes{connected="true"}`), until `cluster.instance_timeout` +
   `hds.stale_after` + 5 s after the kill (so the dead instance's sweep and
   any staleness it would cause are inside). Reattached = the survivors hold
   every dataplane between them.

Prints one JSON object (and writes it to --json). Python 3 standard library;
run as root (PostgreSQL runs as the `postgres` user).
"""

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def rss_bytes(pid):
    """Resident memory of one process (VmRSS), in bytes (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pss_bytes(pid):
    """Proportional set size of one process (shared pages divided among
    their users), in bytes (None when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def mib(b):
    return None if b is None else round(b / 1048576, 1)


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


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
    return {k: v for k, v in metrics(api).items() if k.startswith(("hdsd_inbounds{", "hdsd_store_", "hdsd_readiness_follow"))}


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
                "-c shared_buffers=128MB -c max_connections=300")
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

    def memory(self):
        """(postmaster RSS, sum of every process's PSS), in bytes."""
        pm = self.postmaster()
        pss = [pss_bytes(pid) for pid in [pm] + children(pm)]
        return rss_bytes(pm), sum(x for x in pss if x is not None)

    def sql(self, statement):
        return subprocess.run([str(self.bin / "psql"), "-h", str(self.dir), "-U", "postgres", "-d", "postgres",
                               "-At", "-c", statement], check=True, capture_output=True, text=True).stdout

    def xact_commit(self):
        return int(self.sql("select sum(xact_commit) from pg_stat_database").strip())

    def synchronous_commit(self, on):
        """Set-up only: loading the definitions without waiting for each fsync."""
        self.sql(f"alter system set synchronous_commit = {'on' if on else 'off'}")
        self.sql("select pg_reload_conf()")

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


def free_ports(count):
    """Ports the kernel picked for sockets bound to port 0 (then closed)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def instance_names(n):
    return [chr(ord("a") + i) for i in range(n)]


def config(d, hds, api, pg_url, report_interval_s, instance_timeout_s, max_connections):
    return f"""state_dir = "{d}/state"
[hds]
listen = "{hds}"
report_interval = "{report_interval_s}s"
[hds.limits]
max_connections = {max_connections}
max_connections_per_ip = {max_connections}
[api]
listen = "{api}"
[dataplanes]
source = "api"
[store]
kind = "postgres"
[store.postgres]
url = "{pg_url}"
[cluster]
instance_timeout = "{instance_timeout_s}s"
[auth]
mode = "none"
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--dataplanes", type=int, default=10000)
    ap.add_argument("--window", type=float, default=60.0, help="steady window, seconds")
    ap.add_argument("--latency-window", type=float, default=30.0,
                    help="seconds of timed flips at instance a, seen at the observer")
    ap.add_argument("--latency-sample", type=int, default=10,
                    help="dataplanes of instance a flipping at every report, each flip timed at the observer")
    ap.add_argument("--source-ips", type=int, default=64, help="loopback source addresses of every loadgen")
    ap.add_argument("--report-interval", type=int, default=5, help="hds.report_interval, seconds")
    ap.add_argument("--instance-timeout", type=int, default=10, help="cluster.instance_timeout, seconds")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release"))
    ap.add_argument("--port-base", type=int, default=26000,
                    help="instance i listens on base + 10 i (HDS) and + 2 (API); 0: ports the kernel picks")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.instances < 2:
        raise SystemExit("bench_cluster: --instances must be at least 2 (one of them is killed)")
    report_interval_s = args.report_interval
    stale_after_s = 3 * report_interval_s
    binary = Path(args.bin)
    work = Path(tempfile.mkdtemp(prefix="hdsd-cluster-"))
    os.chmod(work, 0o755)
    procs = []
    pg = None
    try:
        pg = Postgres(work)
        log(f"PostgreSQL {pg.version} up")
        n = args.instances
        names = instance_names(n)
        shares = [args.dataplanes // n] * n
        shares[0] += args.dataplanes - sum(shares)
        killed = n - 1
        survivors = [i for i in range(n) if i != killed]
        observer = 4 if n >= 6 else 1
        # An instance's share once one instance died, plus 5 % for the
        # randomness of where each dead instance's Envoy goes.
        max_connections = -(-args.dataplanes * 105 // (100 * (n - 1)))
        if args.port_base:
            hds = [f"127.0.0.1:{args.port_base + 10 * i}" for i in range(n)]
            api = [f"127.0.0.1:{args.port_base + 10 * i + 2}" for i in range(n)]
        else:
            ports = free_ports(2 * n)
            hds = [f"127.0.0.1:{p}" for p in ports[:n]]
            api = [f"127.0.0.1:{p}" for p in ports[n:]]
        hdsd = []
        for i, name in enumerate(names):
            d = work / name
            d.mkdir()
            (d / "hdsd.toml").write_text(config(d, hds[i], api[i], pg.url, report_interval_s,
                                                args.instance_timeout, max_connections))
            p = subprocess.Popen([str(binary / "hdsd"), "serve", "--config", str(d / "hdsd.toml")],
                                 stdout=open(d / "hdsd.log", "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            hdsd.append(p)
        for i in range(n):
            wait_for(f"instance {names[i]} /readyz",
                     lambda i=i: urllib.request.urlopen(f"http://{api[i]}/readyz", timeout=2).status == 200, 120)
        rss_empty = [rss_bytes(p.pid) for p in hdsd]

        dirs = []
        for i, name in enumerate(names):
            d = work / name / "dataplanes"
            subprocess.run([str(binary / "hdsd-loadgen"), "gen-dataplanes", "--count", str(shares[i]),
                            "--inbounds", "2", "--prefix", f"{name}-", "--dir", str(d)],
                           check=True, stdout=subprocess.DEVNULL)
            dirs.append(d)
        pg.synchronous_commit(False)
        t = time.monotonic()
        appliers = [subprocess.Popen([str(binary / "hdsd"), "apply", "-f", str(d), "--api", f"http://{api[i]}"],
                                     stdout=subprocess.DEVNULL) for i, d in enumerate(dirs)]
        procs.extend(appliers)
        for a in appliers:
            if a.wait() != 0:
                raise SystemExit(f"bench_cluster: hdsd apply exited with {a.returncode}")
        apply_s = time.monotonic() - t
        for i in range(n):
            wait_for(f"instance {names[i]} to know {args.dataplanes} dataplanes",
                     lambda i=i: fleet(api[i])[0] == args.dataplanes, 600, every=1)
        known_s = time.monotonic() - t
        pg.synchronous_commit(True)
        log(f"{args.dataplanes} definitions applied in {apply_s:.1f}s, known by every instance after {known_s:.1f}s")
        time.sleep(2)
        rss_defined = [rss_bytes(p.pid) for p in hdsd]

        def start_loadgen(i):
            out = open(work / names[i] / "loadgen.json", "w")
            servers = ",".join([hds[i]] + [h for j, h in enumerate(hds) if j != i])
            timed = i == 0 and args.latency_sample > 0
            argv = [str(binary / "hdsd-loadgen"), "run", "--hds", servers, "--server-pid", str(hdsd[i].pid),
                    "--dataplanes-dir", str(dirs[i]), "--source-ips", str(args.source_ips),
                    "--connect-timeout", "600s", "--duration", f"{int(args.latency_window)}s",
                    "--linger", "3600s", "--json", "--label", f"cluster-{names[i]}"]
            if timed:
                argv += ["--api", f"http://{api[observer]}", "--sample", str(args.latency_sample)]
            else:
                argv += ["--sample", "0"]
            p = subprocess.Popen(argv, stdout=out, stderr=open(work / names[i] / "loadgen.log", "w"))
            procs.append(p)
            return p

        def wait_held(started):
            # Every started loadgen's Envoys served (an Envoy whose first
            # attempt failed may be served by another instance).
            total = sum(shares[i] for i in started)
            wait_for(f"{total} streams held",
                     lambda: sum(fleet(a)[1] for a in api) == total
                     and all(loadgens[i].poll() is None for i in started), 900, every=1)

        # Every loadgen but a's: instance a knows the fleet and holds nothing.
        loadgens = [None] * n
        t = time.monotonic()
        for i in range(1, n):
            loadgens[i] = start_loadgen(i)
        wait_held(range(1, n))
        time.sleep(report_interval_s + 1)
        rss_fleet_view_a = rss_bytes(hdsd[0].pid)
        fleet_a = fleet(api[0])
        loadgens[0] = start_loadgen(0)
        wait_held(range(n))
        connect_s = time.monotonic() - t
        held_by_a = fleet(api[0])[1]
        log(f"every instance holds its share ({connect_s:.1f}s, a last); timing flips at a until seen at "
            f"{names[observer]}")

        # Report at a -> visible at the observer: a's loadgen prints its
        # results once its window is over and its flips have settled.
        a_json = work / names[0] / "loadgen.json"
        wait_for("instance a's loadgen results",
                 lambda: a_json.read_text().strip() != "" or loadgens[0].poll() is not None,
                 args.latency_window + 4 * report_interval_s + 120, every=1)
        latency_run = json.loads(a_json.read_text().splitlines()[0])
        rss_held_a = rss_bytes(hdsd[0].pid)
        # The flips are over: every inbound should read ready again on every
        # instance before the steady window. Not a precondition (a cluster
        # that cannot keep up reads `stale`): waited for, bounded, recorded.
        t = time.monotonic()
        try:
            wait_for("0 not-ready inbounds on every instance after the flips",
                     lambda: all(fleet(a)[3] == 0 for a in api), 4 * report_interval_s + 30, every=0.5)
        except SystemExit as e:
            log(e)
        not_ready_before_steady = {name: fleet(api[i])[3] for i, name in enumerate(names)}
        not_ready_wait_s = time.monotonic() - t
        propagation = latency_run.get("readiness_propagation") or {}
        latency = {
            "from": names[0],
            "seen_at": names[observer],
            "flipping_dataplanes": args.latency_sample,
            "window_s": args.latency_window,
            "propagation": propagation,
            "not_ready_inbounds_after_the_flips": not_ready_before_steady,
            "waited_for_them_s": round(not_ready_wait_s, 1),
        }
        log("report at a -> visible at", names[observer], json.dumps(propagation))

        # The steady window.
        time.sleep(report_interval_s)
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
        rss_steady = [rss_bytes(p.pid) for p in hdsd]
        pg_rss, pg_pss = pg.memory()
        steady_fleet = [fleet(a) for a in api]
        steady_detail = {name: detail(api[i]) for i, name in enumerate(names)}
        load_after = os.getloadavg()
        pg_cpu = sum(v - (pg0.get(pid) or 0) for pid, v in pg1.items() if v is not None)
        steady = {
            "window_s": round(window, 1),
            "write_tx_per_s": {name: round((c1[i] - c0[i]) / window, 2) for i, name in enumerate(names)},
            "hdsd_cpu_pct": {name: round(100 * (h1[i] - h0[i]) / window, 1) for i, name in enumerate(names)},
            "hdsd_rss_mib": {name: mib(rss_steady[i]) for i, name in enumerate(names)},
            "held": {name: steady_fleet[i][1] for i, name in enumerate(names)},
            "postgres_cpu_pct": round(100 * pg_cpu / window, 1),
            "postgres_rss_mib_postmaster": mib(pg_rss),
            "postgres_pss_mib_all_processes": mib(pg_pss),
            "postgres_processes": len(pg1),
            "postgres_xact_commit_per_s": round((x1 - x0) / window, 1),
            "not_ready_inbounds_at_end": {name: steady_fleet[i][3] for i, name in enumerate(names)},
            "metrics_at_end": steady_detail,
            "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        }
        log("steady:", json.dumps({k: v for k, v in steady.items() if k != "metrics_at_end"}))

        def per(delta, count):
            return None if delta is None or not count else round(delta / count)

        memory = {
            "how": "instance a: RSS with no definition (empty), then knowing every definition and the "
                   "readiness of every other instance's share but holding no stream (fleet view), then "
                   "holding its share (held); per dataplane not held = (fleet view - empty) / dataplanes, "
                   "per held dataplane = (held - fleet view) / its share",
            "a_empty_mib": mib(rss_empty[0]),
            "a_fleet_view_mib": mib(rss_fleet_view_a),
            "a_fleet_view_known_held_inbounds": list(fleet_a[:3]),
            "a_held_mib": mib(rss_held_a),
            "per_dataplane_not_held_bytes": per(rss_fleet_view_a - rss_empty[0], args.dataplanes),
            "a_held_dataplanes": held_by_a,
            "per_held_dataplane_bytes": per(rss_held_a - rss_fleet_view_a, held_by_a),
            "every_instance": {
                name: {
                    "empty_mib": mib(rss_empty[i]),
                    "definitions_known_mib": mib(rss_defined[i]),
                    "steady_mib": mib(rss_steady[i]),
                    "per_definition_bytes": per(rss_defined[i] - rss_empty[i], args.dataplanes),
                    "per_held_dataplane_with_fleet_readiness_bytes": per(rss_steady[i] - rss_defined[i],
                                                                         steady_fleet[i][1]),
                } for i, name in enumerate(names)},
        }
        log("memory:", json.dumps({k: v for k, v in memory.items() if k != "every_instance"}))

        # Failover: the last instance dies with its share of the fleet.
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
        moved = fleet(api[killed])[1]
        cpu_at_kill = [cpu_s(hdsd[i].pid) for i in survivors]
        hdsd[killed].send_signal(signal.SIGKILL)
        wait_for(f"the survivors to hold all {args.dataplanes} streams",
                 lambda: sum(fleet(api[i])[1] for i in survivors) == args.dataplanes, 300, every=0.2)
        reattached_s = time.monotonic() - kill_t
        cpu_moved = sum(cpu_s(hdsd[i].pid) - cpu_at_kill[k] for k, i in enumerate(survivors))
        steady_rate = sum((h1[i] - h0[i]) / window for i in survivors)
        cpu_us_per_reconnect = max(0.0, cpu_moved - steady_rate * reattached_s) / max(1, moved) * 1e6
        log(f"every dataplane held by a survivor {reattached_s:.2f}s after the kill; sampling until the sweep "
            "and staleness")
        time.sleep(max(0.0, kill_t + args.instance_timeout + stale_after_s + 5 - time.monotonic()))
        stop.set()
        sampler.join()
        after = [s for s in samples if s["t"] >= kill_t]
        worst = {names[i]: max((s[names[i]].get("not_ready", 0) for s in after), default=0) for i in survivors}
        errors = sum(1 for s in samples for i in survivors if "error" in s[names[i]])
        failover = {
            "killed": names[killed],
            "moved_dataplanes": moved,
            "max_connections_per_instance": max_connections,
            "reattached_s": round(reattached_s, 2),
            "survivors_cpu_us_per_reconnect": round(cpu_us_per_reconnect, 1),
            "held_after_move": {names[i]: fleet(api[i])[1] for i in survivors},
            "samples": len(after),
            "sample_errors": errors,
            "sampled_for_s": round(samples[-1]["t"] - kill_t, 1),
            "max_not_ready_inbounds": worst,
            "max_not_ready_inbounds_all_survivors": max(worst.values()),
            "worst_sample_metrics": {names[i]: v[1] for i, v in worst_seen.items()},
            "not_ready_before_kill": {names[i]: [s[names[i]].get("not_ready") for s in samples if s["t"] < kill_t]
                                      for i in survivors},
            "held_at_end": {names[i]: samples[-1][names[i]].get("held") for i in survivors},
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        # Stale by mistake: an inbound of a dataplane that is connected
        # somewhere but reads `stale` on a survivor (every `stale` counts:
        # every dataplane is connected after the move).
        failover["max_stale_inbounds"] = {
            names[i]: max((v[1].get('hdsd_inbounds{status="stale"}', 0) for k, v in worst_seen.items() if k == i),
                          default=0) for i in survivors}
        log("failover:", json.dumps({k: v for k, v in failover.items()
                                     if k not in ("worst_sample_metrics", "not_ready_before_kill")}))
        loadgen_results = {}
        for i, name in enumerate(names):
            try:
                loadgen_results[name] = json.loads((work / name / "loadgen.json").read_text().splitlines()[0])
            except (OSError, IndexError, ValueError):
                loadgen_results[name] = None
        result = {
            "dataplanes": args.dataplanes,
            "inbounds_per_dataplane": 2,
            "instances": n,
            "shares": dict(zip(names, shares)),
            "report_interval_s": report_interval_s,
            "instance_timeout_s": args.instance_timeout,
            "source_ips_per_loadgen": args.source_ips,
            "nproc": os.cpu_count(),
            "postgres": pg.version,
            "apply_s": round(apply_s, 1),
            "definitions_known_s": round(known_s, 1),
            "connect_s": round(connect_s, 1),
            "latency": latency,
            "memory": memory,
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
