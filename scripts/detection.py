#!/usr/bin/env python3
"""Detection against its floor, with a real Envoy: a benchmark, not a test.

    scripts/detection.py [--cycles 100] [--hdsd target/release/hdsd] [--json OUT]

One hdsd (auth none), one real Envoy with one dataplane of one inbound, and an
app that is a listening socket of this script. Each cycle stops the app (the
socket is closed: probes are refused at once) and waits until hdsd's watch
(`GET /api/v1/watch`, Server-Sent Events) says the inbound is not ready, then
starts it again and waits for ready. It reports, for both directions, the
distribution of the times against the documented worst case and the floor of
the probe settings, and hdsd's own share: `hdsd_report_processing_seconds`
(a report's arrival on its stream -> visible to the API and the watch), read
from /metrics before and after.

The probe settings (the demo's): interval 1s, timeout 500ms, unhealthy
threshold 2, healthy threshold 1, report interval 1s. For a refused connection
(no timeout) the check fails at once, so:

  stop -> not ready:  floor (U-1) x I = 1s,  worst U x I + R (+ timeout) = 3.5s
  start -> ready:     floor 0,               worst H x I + R (+ timeout) = 2.5s

(I: no_traffic_interval, which hdsd sets to the interval; R: Envoy's report
interval; U and H the thresholds.) Python 3 standard library only.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERVAL, TIMEOUT, UNHEALTHY, HEALTHY, REPORT = 1.0, 0.5, 2, 1, 1.0
WORST_DOWN = UNHEALTHY * INTERVAL + REPORT + TIMEOUT
FLOOR_DOWN = (UNHEALTHY - 1) * INTERVAL
WORST_UP = HEALTHY * INTERVAL + REPORT + TIMEOUT
FLOOR_UP = 0.0
INBOUND_PORT = 10001


def free_port():
    """A port for this benchmark's own servers (a benchmark, not a test: a
    rare race costs one rerun)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """A TCP app that can be stopped and started: a listening socket whose
    accepted connections are closed at once (TCP probes connect only)."""

    def __init__(self, port):
        self.port = port
        self.sock = None
        self.thread = None

    def start(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.sock = s
        self.thread = threading.Thread(target=self._accept, args=(s,), daemon=True)
        self.thread.start()

    def _accept(self, s):
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.close()

    def stop(self):
        s, self.sock = self.sock, None
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        self.thread.join(timeout=5)


class Watch:
    """Follows /api/v1/watch; records (monotonic time, ready) whenever the
    readiness of dataplane `name` (one inbound) changes."""

    def __init__(self, api_port, name="detect"):
        self.name = name
        self.changes = []
        self.cond = threading.Condition()
        self.ready = None
        conn = http.client.HTTPConnection("127.0.0.1", api_port, timeout=None)
        conn.request("GET", "/api/v1/watch", headers={"Accept": "text/event-stream"})
        self.response = conn.getresponse()
        if self.response.status != 200:
            raise SystemExit(f"GET /api/v1/watch answered {self.response.status}")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        event, data = None, []
        for raw in self.response:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and event:
                if event in ("snapshot", "changed") and data:
                    self._item(json.loads("\n".join(data)))
                event, data = None, []

    def _item(self, body):
        items = body.get("snapshot") or [body.get("dataplane") or {}]
        for item in items:
            if item.get("name") != self.name:
                continue
            ready = item["ready"]  # one inbound: the dataplane is ready when it is
            with self.cond:
                if ready != self.ready:
                    self.ready = ready
                    self.changes.append((time.monotonic(), ready))
                    self.cond.notify_all()

    def wait_for(self, ready, after, timeout):
        """The time of the first change to `ready` at or after `after`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for at, value in self.changes:
                    if at >= after and value == ready:
                        return at
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"no change to ready={ready} within {timeout}s; changes: {self.changes[-5:]}")
                self.cond.wait(left)


def dataplane_yaml(name, service, app_port):
    """One dataplane of one inbound (port INBOUND_PORT), its app at app_port."""
    return ("type: Dataplane\nmesh: default\nname: " + name + "\nnetworking:\n  address: 127.0.0.1\n  inbound:\n"
            f"    - port: {INBOUND_PORT}\n      servicePort: {app_port}\n      serviceAddress: 127.0.0.1\n"
            f"      tags:\n        kuma.io/service: {service}\n")


def hdsd_toml(work, hds_port, api_port, auth="none", extra=""):
    """An hdsd configuration with the probe settings above, its state and
    dataplanes under `work`, and `extra` TOML appended."""
    return (f'state_dir = "{work}/state"\n[hds]\nlisten = "127.0.0.1:{hds_port}"\nreport_interval = "{REPORT:g}s"\n'
            f'[hds.check]\ninterval = "{INTERVAL:g}s"\ntimeout = "{int(TIMEOUT * 1000)}ms"\n'
            f"healthy_threshold = {HEALTHY}\nunhealthy_threshold = {UNHEALTHY}\n"
            f'[api]\nlisten = "127.0.0.1:{api_port}"\n[auth]\nmode = "{auth}"\n'
            f'[dataplanes]\ndir = "{work}/dataplanes"\n[log]\nlevel = "warn"\n{extra}')


def get(port, path, timeout=5):
    """(status, body) of GET http://127.0.0.1:port/path."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def wait_until(what, timeout, check, every=0.05):
    """Calls check() until it returns something other than None, at most
    `timeout` seconds; exits naming `what` and the last observation."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = check()
            if value is not None:
                return value
        except OSError as e:
            last = e
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}; last error: {last}")
        time.sleep(every)


def start_hdsd(hdsd, config, log, api_port, procs):
    """Starts `hdsd serve` (added to procs) and waits for its /readyz."""
    proc = subprocess.Popen([hdsd, "serve", "--config", config], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(proc)

    def ready():
        if proc.poll() is not None:
            raise SystemExit(f"hdsd exited with {proc.returncode}; see {log}")
        return True if get(api_port, "/readyz", timeout=1)[0] == 200 else None
    wait_until(f"hdsd /readyz (see {log})", 30, ready)
    return proc


def stop_all(procs):
    """Stops the processes started here, newest first."""
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def phase(i, golden=0.618):
    """A pause of 0.1-0.9 probe intervals, a different phase each cycle, so
    that stops and starts fall anywhere in the probe and report timers."""
    return INTERVAL * (0.1 + 0.8 * ((i * golden) % 1))


def processing_histogram(api_port):
    """{le: count} and the count of hdsd_report_processing_seconds."""
    text = get(api_port, "/metrics")[1]
    buckets = {}
    for line in text.splitlines():
        if line.startswith("hdsd_report_processing_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def quantile_bound(before, after, q):
    """The upper bound of the bucket holding quantile q of the reports
    between the two scrapes (Prometheus buckets are cumulative)."""
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total == 0:
        return None, 0
    for le in sorted(delta):
        if delta[le] >= q * total:
            return le, int(total)
    return float("inf"), int(total)


def summary(values, unit="s", scale=1.0, digits=3):
    """n, min, p25, p50, mean, p75, p99, max and stdev of `values` (seconds),
    shown in `unit` (`scale` per second)."""
    values = sorted(v * scale for v in values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    r = lambda v: round(v, digits)  # noqa: E731
    return {"n": len(values), f"min_{unit}": r(values[0]), f"p25_{unit}": r(pick(0.25)),
            f"p50_{unit}": r(pick(0.5)), f"mean_{unit}": r(statistics.mean(values)),
            f"p75_{unit}": r(pick(0.75)), f"p99_{unit}": r(pick(0.99)), f"max_{unit}": r(values[-1]),
            f"stdev_{unit}": r(statistics.pstdev(values))}


def envoy_bin(args):
    """The Envoy binary of --envoy or $ENVOY_BIN."""
    if not args.envoy:
        raise SystemExit("set ENVOY_BIN (ENVOY_BIN=$(./scripts/setup.sh)) or pass --envoy")
    return args.envoy


def hdsd_bin(args):
    """--hdsd as an absolute path (relative ones from the repository)."""
    return str((ROOT / args.hdsd).resolve()) if not os.path.isabs(args.hdsd) else args.hdsd


def common_args(p):
    """The options every detection benchmark takes."""
    p.add_argument("--hdsd", default=str(Path(os.environ.get("CARGO_TARGET_DIR") or "target") / "release/hdsd"))
    p.add_argument("--envoy", default=os.environ.get("ENVOY_BIN"), help="Envoy binary (default $ENVOY_BIN)")
    p.add_argument("--json", help="write the results here as JSON")


def write_result(result, path):
    """Prints the result as JSON, and writes it to `path` when given."""
    out = json.dumps(result, indent=2)
    print(out)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(out + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=100)
    common_args(p)
    args = p.parse_args()
    envoy, hdsd = envoy_bin(args), hdsd_bin(args)

    work = Path(tempfile.mkdtemp(prefix="hdsd-detection-"))
    hds_port, api_port, app_port, admin_port = free_port(), free_port(), free_port(), free_port()
    (work / "dataplanes").mkdir()
    (work / "dataplanes/detect.yaml").write_text(dataplane_yaml("detect", "detect", app_port))
    (work / "hdsd.toml").write_text(hdsd_toml(work, hds_port, api_port))
    procs = []
    try:
        start_hdsd(hdsd, work / "hdsd.toml", work / "hdsd.log", api_port, procs)
        subprocess.run([hdsd, "bootstrap", "--mesh", "default", "--name", "detect", "--server",
                        f"127.0.0.1:{hds_port}", "--admin-port", str(admin_port), "--out", work / "envoy.yaml"],
                       check=True)
        app = App(app_port)
        app.start()
        watch = Watch(api_port)
        procs.append(subprocess.Popen([envoy, "-c", work / "envoy.yaml", "--use-dynamic-base-id",
                                       "--log-level", "warn"],
                                      stdout=open(work / "envoy.log", "w"), stderr=subprocess.STDOUT))
        watch.wait_for(True, 0.0, 30)
        before = processing_histogram(api_port)
        down, up = [], []
        for i in range(args.cycles):
            # Start each stop at a random phase of the probe and report timers.
            time.sleep(phase(i))
            t = time.monotonic()
            app.stop()
            down.append(watch.wait_for(False, t, WORST_DOWN + 10) - t)
            time.sleep(phase(i, 0.382))
            t = time.monotonic()
            app.start()
            up.append(watch.wait_for(True, t, WORST_UP + 10) - t)
            print(f"cycle {i + 1}/{args.cycles}: not ready after {down[-1]:.3f}s, ready after {up[-1]:.3f}s",
                  file=sys.stderr)
        after = processing_histogram(api_port)
        p99, reports = quantile_bound(before, after, 0.99)
        p50, _ = quantile_bound(before, after, 0.50)
        write_result({
            "settings": {"interval_s": INTERVAL, "timeout_s": TIMEOUT, "unhealthy_threshold": UNHEALTHY,
                         "healthy_threshold": HEALTHY, "report_interval_s": REPORT},
            "stop_to_not_ready": dict(summary(down), floor_s=FLOOR_DOWN, worst_case_s=WORST_DOWN,
                                      over_worst_case=sum(1 for d in down if d > WORST_DOWN)),
            "start_to_ready": dict(summary(up), floor_s=FLOOR_UP, worst_case_s=WORST_UP,
                                   over_worst_case=sum(1 for u in up if u > WORST_UP)),
            "hdsd_share": {"reports": reports, "p50_le_s": p50, "p99_le_s": p99,
                           "what": "hdsd_report_processing_seconds: report arrival -> visible (bucket bounds)"},
            "loadavg": open("/proc/loadavg").read().split()[:3],
        }, args.json)
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
