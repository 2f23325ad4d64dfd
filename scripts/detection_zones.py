#!/usr/bin/env python3
"""Cross-zone detection: an app stops in zone B, a front Envoy in zone A sees it.

    scripts/detection_zones.py [--cycles 100] [--hdsd target/release/hdsd] [--poll-ms 5] [--json OUT]

A benchmark, not a test. On loopback: a global hdsd (zones eu-1 and us-1), a
zone hdsd "us-1" (zone B) with one real Envoy and one dataplane `web-01` of
one inbound of service `web` (its app a listening socket of this script, as
in scripts/detection.py), a zone hdsd "eu-1" (zone A) with no dataplane, and
a front Envoy in zone A (`hdsd bootstrap front --service web --zone eu-1`)
taking `default/web` from the global's EDS. Each cycle stops the app, then
starts it again (detection.py's probe settings), two flips; for each:

  floor  app stop (start) -> zone B's watch (`GET /api/v1/watch`, SSE) says
         not ready (ready): zone B's own detection, which no cross-zone path
         can beat;
  total  app stop (start) -> the front's admin API (`GET /clusters`) shows
         the endpoint's `health_flags` changed (`/failed_eds_health`, then
         `healthy`), polled every --poll-ms from the moment zone B's watch
         said so: an upper bound, late by up to one poll interval and one
         admin request (`poll_window`: the last poll that did not show it ->
         the answer of the one that did);
  share  total - floor: hdsd's cross-zone share (zone B's uplink -> the
         global -> its EDS index -> the push -> the front applies it), from
         the polls. Target: p99 <= 50 ms.

The same share is also taken from timestamps, which no poll blurs: the
front's own log (`--log-format '%E.%f ...'`, Unix time in microseconds;
`config` and `upstream` at debug) has "Received gRPC message" for the
assignment (the push arrives) and "EDS hosts or locality weights changed"
(applied on Envoy's main thread, the state `/clusters` reads):
`share_applied` = applied - zone B's watch. Read after each flip, so as not
to disturb it: zone B's `health.since` of the inbound (when zone B changed
the status: `share_decided` = applied - since) and the global's `lastSeen`
of zone B (`GET /api/v1/zones/us-1`: when the global took the zone's change;
heartbeats are set 30 s apart so that the last message is nearly always the
change, and a flip whose lastSeen is later than the front is left out of
that split). The split: decided -> zone B's watch, decided -> the global,
the global -> the push at the front, the push -> applied. Wall times are
turned into the monotonic clock at each flip. Python 3 standard library
only.
"""

import argparse
import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import detection as d  # noqa: E402

TARGET_P99_MS = 50.0
FRONT_TOKEN = "front-bench-token"
ZONE_B, ZONE_A = "us-1", "eu-1"
DATAPLANE, SERVICE = "web-01", "web"
HEARTBEAT = "30s"  # the default 5 s would move lastSeen between a change and its reading
ASSIGNMENT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LOG_LINE = re.compile(r"^(\d+\.\d+) \[(\w+)\] (.*)$")


class Front:
    """The front Envoy's admin API: the endpoint's health flags, polled over
    one kept-alive connection."""

    def __init__(self, admin_port, endpoint):
        self.admin_port = admin_port
        self.prefix = f"default/{SERVICE}::{endpoint}::health_flags::"
        self.conn = None

    def flags(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=2)
        try:
            self.conn.request("GET", "/clusters")
            text = self.conn.getresponse().read().decode()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise OSError("front admin /clusters failed")
        for line in text.splitlines():
            if line.startswith(self.prefix):
                return line[len(self.prefix):]
        return None

    @staticmethod
    def shows(flags, healthy):
        if flags is None:
            return False
        return flags == "healthy" if healthy else "failed_eds_health" in flags

    def wait_for(self, healthy, since, timeout, every):
        """Polls every `every` seconds until the flags show `healthy`:
        (the last poll sent before, the poll that showed it sent, received).
        `since` is the lower bound for the first poll."""
        deadline = time.monotonic() + timeout
        before = since
        while True:
            sent = time.monotonic()
            try:
                flags = self.flags()
            except OSError:
                flags = None
            received = time.monotonic()
            if self.shows(flags, healthy):
                return before, sent, received
            if received > deadline:
                raise SystemExit(f"the front did not show healthy={healthy} within {timeout}s; flags: {flags}")
            before = sent
            time.sleep(max(0.0, sent + every - time.monotonic()))


class EnvoyLog:
    """The front's log lines `<unix seconds.micros> [<component>] <message>`:
    when each assignment arrived and when one was applied."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.received, self.applied = [], []

    def read(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            m = LOG_LINE.match(line)
            if not m:
                continue
            at, message = float(m.group(1)), m.group(3)
            if message.startswith(f"Received gRPC message for {ASSIGNMENT}"):
                self.received.append(at)
            elif message.startswith(f"EDS hosts or locality weights changed for cluster: default/{SERVICE} "):
                self.applied.append(at)

    def flip(self, since, timeout):
        """(pushes received, first received, first applied) at or after wall
        time `since`, the received one the last before the applied one."""
        deadline = time.monotonic() + timeout
        while True:
            self.read()
            applied = [a for a in self.applied if a >= since]
            if applied:
                received = [r for r in self.received if since <= r <= applied[0]]
                return len(received), (received[-1] if received else None), applied[0]
            if time.monotonic() > deadline:
                return 0, None, None
            time.sleep(0.02)


def wall(text):
    """An RFC 3339 time of hdsd's API as Unix seconds (any fraction digits)."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    seconds = datetime.fromisoformat(m.group(1) + zone).timestamp()
    return seconds + (float("0." + m.group(2)) if m.group(2) else 0.0)


def zone_synced(global_api, zone):
    """The global's summary of `zone` once it is online and complete."""
    status, body = d.get(global_api, f"/api/v1/zones/{zone}")
    if status != 200:
        return None
    item = json.loads(body)
    online = item.get("state") == "online" and item.get("revision") is not None
    return item if online else None


def version(binary):
    """The x.y.z a binary's --version prints ("hdsd 0.1.0", "envoy  version: <sha>/1.40.0/Clean/...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(?:^|[ /])(\d+\.\d+\.\d+)(?:$|[ /])", out, re.M)
    return m.group(1) if m else out.strip()


class LoadSampler:
    """The 1-minute load average, sampled every 10 s while the flips run."""

    def __init__(self):
        self.samples = []
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            self.samples.append(float(open("/proc/loadavg").read().split()[0]))
            if self.stop.wait(10):
                return

    def result(self):
        self.stop.set()
        return {"samples": len(self.samples), "min": min(self.samples), "max": max(self.samples)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=100, help="stops and starts (two flips each)")
    p.add_argument("--poll-ms", type=float, default=5.0, help="the front's admin API is polled this often")
    p.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs) after a success")
    d.common_args(p)
    args = p.parse_args()
    envoy, hdsd = d.envoy_bin(args), d.hdsd_bin(args)
    poll = args.poll_ms / 1000.0
    load_before = open("/proc/loadavg").read().split()[:3]

    work = Path(tempfile.mkdtemp(prefix="hdsd-detection-zones-"))
    print(f"work directory (configs and logs): {work}", file=sys.stderr)
    g_hds, g_api, g_zones = d.free_port(), d.free_port(), d.free_port()
    homes = {z: work / z for z in ("global", ZONE_B, ZONE_A)}
    for home in homes.values():
        (home / "dataplanes").mkdir(parents=True)
    (homes["global"] / "hdsd.toml").write_text(d.hdsd_toml(
        homes["global"], g_hds, g_api, auth="token",
        extra=f'[global]\nenabled = true\nlisten = "127.0.0.1:{g_zones}"\nheartbeat_interval = "{HEARTBEAT}"\n'
              f'zone_timeout = "90s"\nzones = ["{ZONE_A}", "{ZONE_B}"]\n[eds]\ntokens = ["{FRONT_TOKEN}"]\n'))
    procs = []
    try:
        d.start_hdsd(hdsd, homes["global"] / "hdsd.toml", homes["global"] / "hdsd.log", g_api, procs)
        ports = {}
        for zone in (ZONE_B, ZONE_A):
            token = subprocess.run([hdsd, "token", "issue", "--config", homes["global"] / "hdsd.toml", "--zone",
                                    zone, "--mesh", "default"], check=True, capture_output=True, text=True,
                                   timeout=30).stdout.strip()
            (homes[zone] / "zone.token").write_text(token + "\n")
            ports[zone] = (d.free_port(), d.free_port())
            (homes[zone] / "hdsd.toml").write_text(d.hdsd_toml(
                homes[zone], *ports[zone],
                extra=f'[zone]\nname = "{zone}"\nglobal = ["http://127.0.0.1:{g_zones}"]\n'
                      f'token_file = "{homes[zone]}/zone.token"\n'))
        b_hds, b_api = ports[ZONE_B]
        app_port, sidecar_admin, front_admin, front_listen = d.free_port(), d.free_port(), d.free_port(), d.free_port()
        (homes[ZONE_B] / "dataplanes/web.yaml").write_text(d.dataplane_yaml(DATAPLANE, SERVICE, app_port))
        for zone in (ZONE_B, ZONE_A):
            d.start_hdsd(hdsd, homes[zone] / "hdsd.toml", homes[zone] / "hdsd.log", ports[zone][1], procs)

        app = d.App(app_port)
        app.start()
        watch = d.Watch(b_api, DATAPLANE)
        sidecar = homes[ZONE_B] / "envoy.yaml"
        subprocess.run([hdsd, "bootstrap", "--mesh", "default", "--name", DATAPLANE, "--server",
                        f"127.0.0.1:{b_hds}", "--admin-port", str(sidecar_admin), "--out", sidecar],
                       check=True, timeout=30)
        procs.append(subprocess.Popen([envoy, "-c", sidecar, "--use-dynamic-base-id", "--log-level", "warn"],
                                      stdout=open(homes[ZONE_B] / "envoy.log", "w"), stderr=subprocess.STDOUT))
        watch.wait_for(True, 0.0, 30)
        for zone in (ZONE_B, ZONE_A):
            d.wait_until(f"zone {zone} online and synced at the global", 60, lambda z=zone: zone_synced(g_api, z))

        front_yaml, front_log = work / "front.yaml", work / "front.log"
        subprocess.run([hdsd, "bootstrap", "front", "--service", SERVICE, "--zone", ZONE_A, "--listen",
                        f"127.0.0.1:{front_listen}", "--server", f"127.0.0.1:{g_hds}", "--token", FRONT_TOKEN,
                        "--admin-port", str(front_admin), "--out", front_yaml], check=True, timeout=30)
        procs.append(subprocess.Popen([envoy, "-c", front_yaml, "--use-dynamic-base-id", "--log-level", "warn",
                                       "--component-log-level", "config:debug,upstream:debug",
                                       "--log-format", "%E.%f [%n] %v"],
                                      stdout=open(front_log, "w"), stderr=subprocess.STDOUT))
        front = Front(front_admin, f"127.0.0.1:{d.INBOUND_PORT}")
        front.wait_for(True, time.monotonic(), 30, 0.05)
        log = EnvoyLog(front_log)

        flips = {"down": [], "up": []}
        load = LoadSampler()
        for i in range(args.cycles):
            for direction, healthy, pause, worst in (("down", False, d.phase(i), d.WORST_DOWN),
                                                     ("up", True, d.phase(i, 0.382), d.WORST_UP)):
                time.sleep(pause)
                t0_wall, t0 = time.time(), time.monotonic()
                mono = lambda w: None if w is None else w + t0 - t0_wall  # noqa: E731 (wall -> monotonic)
                app.start() if healthy else app.stop()
                at = {"api": watch.wait_for(healthy, t0, worst + 10)}
                at["poll_before"], _, at["poll"] = front.wait_for(healthy, at["api"], 10, poll)
                pushes, received, applied = log.flip(t0_wall, 2)
                at["received"], at["applied"] = mono(received), mono(applied)
                # Read after the flip, so as not to disturb it: when zone B changed the status, when the
                # global last heard from zone B (the change, unless a heartbeat came after it).
                item = json.loads(d.get(b_api, f"/api/v1/dataplanes/default/{DATAPLANE}")[1])
                at["decided"] = mono(wall(item["inbounds"][0]["health"]["since"]))
                seen = json.loads(d.get(g_api, f"/api/v1/zones/{ZONE_B}")[1]).get("lastSeen")
                at["global"] = mono(wall(seen)) if seen else None
                if at["global"] is not None and at["global"] > at["poll"]:
                    at["global"] = None  # a heartbeat after the change
                span = lambda a, b: None if at[a] is None or at[b] is None else at[b] - at[a]  # noqa: E731
                flips[direction].append({
                    "floor": at["api"] - t0, "total": at["poll"] - t0, "share": span("api", "poll"),
                    "poll_window": span("poll_before", "poll"), "first_poll": at["poll_before"] == at["api"],
                    "total_applied": None if at["applied"] is None else at["applied"] - t0,
                    "share_applied": span("api", "applied"), "share_decided": span("decided", "applied"),
                    "decided_to_api": span("decided", "api"), "decided_to_global": span("decided", "global"),
                    "global_to_push": span("global", "received"), "push_to_applied": span("received", "applied"),
                    "pushes": pushes,
                })
                f = flips[direction][-1]
                print(f"cycle {i + 1}/{args.cycles} {direction}: zone B after {f['floor']:.3f}s, front after "
                      f"{f['total']:.3f}s, share {f['share'] * 1000:.1f} ms (polled), "
                      f"{(f['share_applied'] or float('nan')) * 1000:.2f} ms (front's log)", file=sys.stderr)

        def stats(samples, key, unit="ms"):
            values = [s[key] for s in samples if s[key] is not None]
            if not values:
                return {"n": 0, "n_missing": len(samples)}
            return dict(d.summary(values, unit=unit, scale=1000 if unit == "ms" else 1,
                                  digits=2 if unit == "ms" else 3), n_missing=len(samples) - len(values))

        every = flips["down"] + flips["up"]
        result = {
            "settings": {"interval_s": d.INTERVAL, "timeout_s": d.TIMEOUT, "unhealthy_threshold": d.UNHEALTHY,
                         "healthy_threshold": d.HEALTHY, "report_interval_s": d.REPORT, "poll_ms": args.poll_ms,
                         "heartbeat_interval": HEARTBEAT},
            "versions": {"hdsd": version(hdsd), "envoy": version(envoy)},
            "flips": len(every),
            "target_share_p99_ms": TARGET_P99_MS,
        }
        for name, samples in (("all", every), ("down", flips["down"]), ("up", flips["up"])):
            result[name] = {
                "floor": stats(samples, "floor", "s"),
                "total": stats(samples, "total", "s"),
                "total_applied": stats(samples, "total_applied", "s"),
                "share": stats(samples, "share"),
                "share_applied": stats(samples, "share_applied"),
                "share_decided": stats(samples, "share_decided"),
                "poll_window": stats(samples, "poll_window"),
                "split": {k: stats(samples, k) for k in ("decided_to_api", "decided_to_global", "global_to_push",
                                                         "push_to_applied")},
                "first_poll_hits": sum(1 for s in samples if s["first_poll"]),
                "pushes_per_flip": sorted({s["pushes"] for s in samples}),
            }
        result["share_p99_met"] = result["all"]["share"]["p99_ms"] <= TARGET_P99_MS
        result["share_applied_p99_met"] = result["all"]["share_applied"].get("p99_ms", float("inf")) <= TARGET_P99_MS
        result["loadavg_before"] = load_before
        result["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
        result["loadavg_1m_during"] = load.result()
        result["samples"] = {k: [{m: (round(v * 1000, 3) if isinstance(v, float) else v) for m, v in f.items()}
                                 for f in fl] for k, fl in flips.items()}  # per flip, in ms
        d.write_result(result, args.json)
    finally:
        d.stop_all(procs)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
