#!/usr/bin/env python3
"""hdsd's demo: hdsd with token auth, real Envoys and tiny apps on this machine.

    make demo                      # or: ./scripts/demo.py
    ./scripts/demo.py --once       # the same story, non-interactive: PASS/FAIL per step
    make demo ARGS=--zones         # or: ./scripts/demo.py --zones [--once]: the multi-zone story below

In a fresh work directory (.demo/) it creates a signing key, issues one token
per dataplane and writes the Envoy bootstraps (all through docker/hdsd-init.sh,
the recipe docker-compose.yml uses too), then starts hdsd (examples/hdsd.toml,
dataplanes from examples/dataplanes/ plus a second web dataplane, web-02, that
only the demo adds), the demo apps and one Envoy per dataplane, each with its
log in .demo/logs/. The web Envoys also proxy their inbound port to their app,
as a sidecar does. A front Envoy (`hdsd bootstrap front --service web`) takes
the web service's endpoints from hdsd over EDS, and a client sends it about 50
requests/s for the whole story, counting who answers and every failure.
Then it tells the story, every step waiting on hdsd's REST API with a deadline:

  (a) every inbound becomes ready, and the front Envoy sends requests to both
      web apps;
  (b) the web app of web-01 stops: its inbound turns not ready within the
      documented worst-case detection time, the others stay ready; the front
      Envoy marks web-01's endpoint unhealthy and web-02 answers everything:
      not one client request fails;
  (c) the web app starts again: its inbound is ready again and the front sends
      it requests again, still with no failed request;
  (d) a third Envoy claims to be backend-01 with web-01's token: hdsd refuses it
      and keeps backend-01's own Envoy.

The first line is the fleet page's address (hdsd serves it at /ui/ on its API
listener): open it in a browser to watch every step happen there too.

--zones tells another story, across zones (docs/zones.md): a global hdsd and
two zone hdsds, eu-1 and us-1, each zone with its own demo apps (two in eu-1,
one in us-1), a sidecar Envoy per app and no token for its own Envoys; the
global issues each zone its zone token (`hdsd token issue --zone`). A front
Envoy in eu-1 (`hdsd bootstrap front --service web --zone eu-1`) takes web's
endpoints from the global's EDS, eu-1's first, and the client sends it about
50 requests/s for the whole story, counting which zone answers:

  (a) both zones are online at the global (GET /api/v1/zones), and the
      global's /api/v1/dataplanes lists every inbound ready with its zone;
  (b) the front gets every endpoint, eu-1's at priority 0 and us-1's at
      priority 1, and eu-1's apps answer every request;
  (c) both eu-1 apps stop: their inbounds turn not ready at the global within
      the zone's worst-case detection time, and every request goes to us-1
      with not one failed;
  (d) they start again: ready again, and eu-1 answers everything again;
  (e) us-1's hdsd is frozen (SIGSTOP): the global reads us-1 offline within
      zone_timeout + 1s, keeps its dataplane with its last readiness and
      hands the front its endpoint as degraded; eu-1 stays online;
  (f) it wakes (SIGCONT): us-1 is online again, its inbound ready.

The global's timings are short (heartbeat_interval 1s, zone_timeout 3s); the
ports are one block from --zones-port-base (16700). The first line is the
global's page, which lists both zones' dataplanes.

Interactive (default): prints where to look, runs the story, then shows the
live table (`hdsd status --watch`; with --zones, the zones' states as the
global sees them) until Ctrl-C. --once: prints PASS/FAIL per
step and exits non-zero if a step did not happen as said.

Ctrl-C, SIGTERM, a failure or an exception stops every process the demo
started (each runs in its own process group) and checks that none is left.
Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Every path handed to a child is relative to ROOT (the children run there).
WORK = Path(".demo")
CONFIG = Path("examples/hdsd.toml")
EXAMPLE_DATAPLANES = Path("examples/dataplanes")
INIT_SCRIPT = Path("docker/hdsd-init.sh")
# Cargo puts binaries under $CARGO_TARGET_DIR when it is set, as `make` does.
DEFAULT_HDSD = Path(os.environ.get("CARGO_TARGET_DIR") or "target") / "release" / "hdsd"

MESH = "default"
WEB, BACKEND = "web-01", "backend-01"
# The demo's own second web dataplane (not in examples/dataplanes/: the compose
# setup has one web app), so that the front Envoy has somewhere to send
# requests while web-01's app is stopped.
WEB2 = "web-02"
WEB2_INBOUND = 10084
# A dataplane of service web: one inbound proxying to its app.
WEB_DATAPLANE = """type: Dataplane
mesh: default
name: {name}
networking:
  address: 127.0.0.1
  inbound:
    - port: {inbound}
      servicePort: {app_port}
      serviceAddress: 127.0.0.1
      tags:
        kuma.io/service: web
        kuma.io/protocol: http
"""
WEB2_FILE = """# Written by scripts/demo.py: a second web dataplane, so that traffic has
# somewhere to go while web-01's app is stopped.
""" + WEB_DATAPLANE.replace("{name}", "web-02")
# Requests per second the demo's client sends through the front Envoy.
CLIENT_RATE = 50
# The servicePort values in examples/dataplanes/, in --app-ports order.
EXAMPLE_APP_PORTS = (18081, 18082, 18083)
# Envoy's public inbound ports in examples/dataplanes/ (identify the inbounds).
WEB_INBOUND, API_INBOUND, ADMIN_INBOUND = 10081, 10082, 10083

POLL = 0.05  # seconds between two looks at the REST API
# What "within the documented worst case" tolerates on top of it: one API poll,
# the API round trip and process scheduling.
MEASUREMENT_SLACK = 0.5


class DemoError(Exception):
    """A step did not happen as said, or the demo could not be set up."""


class Interrupted(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C."""


# ---------------------------------------------------------------- output

def say(text=""):
    print(text, flush=True)


def step_line(text):
    say(f"\n>>> {text}")


def tail(path, lines=25):
    try:
        text = (ROOT / path).read_text(errors="replace").splitlines()
    except OSError:
        return f"    ({path} not readable)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty)"


# ---------------------------------------------------------------- config

def parse_duration(text):
    """humantime-style durations as hdsd takes them: 500ms, 1s, 2m, 1h 30m."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0,
             "mins": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text.strip())
    if not parts or re.sub(r"[\d.\sa-z]", "", text):
        raise DemoError(f"cannot read duration {text!r} in {CONFIG}")
    total = 0.0
    for number, unit in parts:
        if unit not in units:
            raise DemoError(f"unknown duration unit {unit!r} in {text!r} ({CONFIG})")
        total += float(number) * units[unit]
    return total


def read_toml(path):
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return read_toml_minimal(path)
    with open(ROOT / path, "rb") as f:
        return tomllib.load(f)


def read_toml_minimal(path):
    """Enough TOML for examples/hdsd.toml on Python < 3.11: [a.b] tables, key = "str" | int."""
    data = {}
    table = data
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[([\w.]+)\]", line)
        if m:
            table = data
            for key in m.group(1).split("."):
                table = table.setdefault(key, {})
            continue
        m = re.fullmatch(r"(\w+)\s*=\s*(.+)", line)
        if m:
            value = m.group(2).strip()
            if value.startswith('"'):
                value = value.strip('"')
            elif re.fullmatch(r"\d+", value):
                value = int(value)
            table[m.group(1)] = value
    return data


class Settings:
    """The check settings in force, from examples/hdsd.toml and hdsd's defaults."""

    def __init__(self, path):
        doc = read_toml(path)
        hds = doc.get("hds", {})
        check = hds.get("check", {})
        # Defaults as `hdsd config defaults` prints them.
        self.report_interval = parse_duration(hds.get("report_interval", "5s"))
        self.interval = parse_duration(check.get("interval", "1s"))
        self.timeout = parse_duration(check.get("timeout", "1s"))
        self.no_traffic_interval = parse_duration(check.get("no_traffic_interval", check.get("interval", "1s")))
        self.healthy_threshold = int(check.get("healthy_threshold", 1))
        self.unhealthy_threshold = int(check.get("unhealthy_threshold", 2))
        self.auth_mode = doc.get("auth", {}).get("mode", "token")

    def worst_case_detection(self):
        """unhealthy_threshold x no_traffic_interval + timeout + report_interval (src/probe.rs)."""
        return self.unhealthy_threshold * self.no_traffic_interval + self.timeout + self.report_interval

    def worst_case_recovery(self):
        """The same bound for the way back: healthy_threshold probes."""
        return self.healthy_threshold * self.no_traffic_interval + self.timeout + self.report_interval

    def formula(self):
        return (f"unhealthy_threshold {self.unhealthy_threshold} x no_traffic_interval {fmt_s(self.no_traffic_interval)}"
                f" + timeout {fmt_s(self.timeout)} + report_interval {fmt_s(self.report_interval)}")


def fmt_s(seconds):
    if seconds < 1 and seconds * 1000 == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


# ---------------------------------------------------------------- processes

def die_with_parent():
    """In a child before exec: get SIGTERM if the demo itself dies (even by SIGKILL). Linux only."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Proc:
    """A child in its own session (so its own process group), logging to a file."""

    def __init__(self, name, argv, log, env):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = log
        (ROOT / log).parent.mkdir(parents=True, exist_ok=True)
        with open(ROOT / log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the child leads its own group
        self.expected_running = True

    def running(self):
        return self.popen.poll() is None

    def group_alive(self):
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def signal_group(self, sig):
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Supervisor:
    """Starts children and stops every one of them, whatever happens."""

    def __init__(self, env):
        self.env = env
        self.procs = []

    def start(self, name, argv, log):
        # NO_COLOR: plain logs in the files.
        proc = Proc(name, argv, log, dict(self.env, NO_COLOR="1"))
        self.procs.append(proc)
        return proc

    def run(self, name, argv, log, timeout=60):
        """Runs a short command to completion (in its own group, stopped on interrupt)."""
        proc = self.start(name, argv, log)
        proc.expected_running = False
        try:
            code = proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DemoError(f"{name} did not finish within {timeout}s; its log ({log}):\n{tail(log)}") from None
        if code != 0:
            raise DemoError(f"{name} failed (exit {code}); its log ({log}):\n{tail(log)}")
        return (ROOT / log).read_text(errors="replace")

    def check_running(self):
        """Fails when a process that should be running has exited."""
        for p in self.procs:
            if p.expected_running and not p.running():
                raise DemoError(
                    f"{p.name} exited unexpectedly (exit {p.popen.returncode}); its log ({p.log}):\n{tail(p.log)}")

    def stop(self, proc, grace=5.0):
        """SIGTERM to the process group, SIGKILL after `grace`; reaps the child."""
        proc.expected_running = False
        if proc.running() or proc.group_alive():
            proc.signal_group(signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.signal_group(signal.SIGKILL)
                proc.popen.wait(timeout=5)
        # Anything the leader left behind in its group goes too.
        if proc.group_alive():
            proc.signal_group(signal.SIGKILL)
            deadline = time.monotonic() + 2
            while proc.group_alive() and time.monotonic() < deadline:
                time.sleep(0.02)

    def stop_all(self):
        """Stops every child, newest first; returns the ones still alive (should be none)."""
        live = [p for p in self.procs if p.running() or p.group_alive()]
        for p in live:
            p.expected_running = False
            p.signal_group(signal.SIGTERM)
            # A process the story froze (SIGSTOP) must wake to act on it.
            p.signal_group(signal.SIGCONT)
        deadline = time.monotonic() + 5
        for p in reversed(live):
            try:
                p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in reversed(live):
            self.stop(p, grace=0.0)
        for p in self.procs:
            p.popen.poll()
        return [p for p in self.procs if p.running() or p.group_alive()]


# ---------------------------------------------------------------- helpers

def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like the servers we start: a port in TIME_WAIT is free, one with a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def accepting(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def http_get(url, timeout=1.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


def get_json(url):
    status, body = http_get(url)
    return json.loads(body)


def strip_ansi(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def percent_decode(text):
    return urllib.parse.unquote(text)


class Deadline(DemoError):
    pass


def sidecar_inbound(port, app_port):
    """Envoy config merged into a web Envoy's bootstrap (--config-yaml): its
    inbound listener, proxying 127.0.0.1:port to the app, as a sidecar does."""
    cluster = f"inbound:127.0.0.1:{app_port}"
    return {"static_resources": {
        "listeners": [{
            "name": f"inbound:127.0.0.1:{port}",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "inbound", "cluster": cluster}}]}]}],
        "clusters": [{
            "name": cluster, "type": "STATIC", "connect_timeout": "0.25s",
            "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": app_port}}}}]}]}}]}}


class Client:
    """Sends CLIENT_RATE requests/s through the front Envoy from a thread,
    counting the answers per app and every failure (status or connection)."""

    def __init__(self, url):
        self.url = url
        self.lock = threading.Lock()
        self.answers = {}      # app name -> count
        self.failures = 0
        self.last_failure = None
        self.last_answer = {}  # app name -> time.monotonic() of its last answer
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="front-client", daemon=True)
        self.thread.start()

    def _run(self):
        period = 1.0 / CLIENT_RATE
        next_at = time.monotonic()
        while not self.stopping.is_set():
            try:
                status, body = http_get(self.url, timeout=2.0)
                app = body.strip().removeprefix("hello from ") if status == 200 else None
                error = None if app else f"HTTP {status}: {body.strip()[:80]}"
            except urllib.error.HTTPError as e:
                app, error = None, f"HTTP {e.code}: {e.read().decode(errors='replace').strip()[:80]}"
            except OSError as e:
                app, error = None, f"{type(e).__name__}: {e}"
            with self.lock:
                if app:
                    self.answers[app] = self.answers.get(app, 0) + 1
                    self.last_answer[app] = time.monotonic()
                else:
                    self.failures += 1
                    self.last_failure = error
            next_at += period
            self.stopping.wait(max(0.0, next_at - time.monotonic()))

    def counts(self):
        """(answers per app, failures, last failure), a consistent snapshot."""
        with self.lock:
            return dict(self.answers), self.failures, self.last_failure

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=5)


class Background:
    """Runs `wait` (a wait_until of its own) on a thread from now on;
    `result()` joins it and returns its value, or raises what it raised."""

    def __init__(self, wait):
        self.value, self.error = None, None

        def run():
            try:
                self.value = wait()
            except Exception as e:  # handed to result()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def wait_until(sup, what, timeout, check):
    """Polls `check` until it returns (True, value); returns (seconds, value).

    `check` returns (done, observation). Fails after `timeout` naming what was
    awaited and the last observation, or as soon as a child that should be
    running has died."""
    start = time.monotonic()
    last = "nothing yet"
    while True:
        try:
            done, last = check()
        except (OSError, ValueError, KeyError, TypeError) as e:  # URLError is an OSError
            done, last = False, f"{type(e).__name__}: {e}"
        elapsed = time.monotonic() - start
        if done:
            return elapsed, last
        sup.check_running()
        if elapsed > timeout:
            raise Deadline(f"timed out after {timeout:g}s waiting for {what}; last seen: {last}")
        time.sleep(POLL)


# ---------------------------------------------------------------- the demo

class Story:
    """What both stories share: their steps, each recorded PASS/FAIL, run in order."""

    STEPS = ""     # the step letters, in order; each has a step_<letter> method
    NAME = "demo story"

    def record(self, step, passed, seconds, note):
        self.results.append((step, passed, seconds, note))
        if self.once:
            say(f"    {'PASS' if passed else 'FAIL'} {step}: {note}")
        else:
            say(f"    {note}")
        if not passed:
            raise DemoError(f"step {step} did not happen as said: {note}")

    def wait_for_person(self):
        """Interactive, on a terminal: the page is live now; the story starts
        when the person says so."""
        if self.once or not sys.stdin.isatty():
            return
        say(f"    everything is up: open {self.page_url()} now, then press Enter to start the story "
            f"(each step waits {self.args.step_pause:g}s so that you can watch it)")
        sys.stdin.readline()

    def run_steps(self):
        self.wait_for_person()
        for i, letter in enumerate(self.STEPS):
            if i and not self.once:
                time.sleep(self.args.step_pause)  # pacing for a person watching, not a wait
            try:
                getattr(self, f"step_{letter}")()
            except DemoError as e:
                if not any(r[0] == letter for r in self.results):
                    self.results.append((letter, False, None, str(e).splitlines()[0]))
                    if self.once:
                        say(f"    FAIL {letter}: {str(e).splitlines()[0]}")
                raise

    def failure_logs(self):
        """The logs worth showing when the story fails: (what, path) pairs."""
        return [("hdsd log", WORK / "logs/hdsd.log")]


class Demo(Story):
    STEPS = "abcd"

    def __init__(self, args):
        self.args = args
        self.once = args.once
        self.settings = Settings(CONFIG)
        self.hdsd = Path(args.hdsd)
        self.api = f"http://127.0.0.1:{args.api_port}"
        self.hds = f"127.0.0.1:{args.hds_port}"
        self.app_ports = dict(zip(("web", "backend-api", "backend-admin"), args.app_ports))
        self.app_ports["web-2"] = args.web2_port
        self.admin_ports = dict(zip((WEB, BACKEND, "intruder", WEB2, "front"), args.admin_ports))
        # Each web Envoy's inbound listener (a sidecar's public port) and its app.
        self.inbound_ports = {WEB: (WEB_INBOUND, "web"), WEB2: (WEB2_INBOUND, "web-2")}
        self.front_url = f"http://127.0.0.1:{args.front_port}/"
        self.eds_token = "demo-front-" + secrets.token_hex(16)
        self.results = []  # (step, passed, seconds, note)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HDSD_")}
        env.update({
            "HDSD_STATE_DIR": str(WORK / "state"),
            "HDSD_DATAPLANES__DIR": str(WORK / "dataplanes"),
            "HDSD_HDS__LISTEN": self.hds,
            "HDSD_API__LISTEN": f"127.0.0.1:{args.api_port}",
            # The front Envoy's EDS token: it takes endpoints, it cannot read the REST API.
            "HDSD_EDS__TOKENS": f"[{self.eds_token}]",
        })
        self.sup = Supervisor(env)
        self.apps = {}
        self.envoys = {}
        self.client = None

    # -- setup

    def init_argv(self):
        """The docker/hdsd-init.sh invocation (compose's hdsd-init runs the same script)."""
        return ["sh", str(INIT_SCRIPT), "--hdsd", str(self.hdsd), "--config", str(CONFIG),
                "--server", self.hds, "--out", str(WORK / "bootstrap"), "--valid-for", "24h",
                f"{MESH}.{WEB}:{self.admin_ports[WEB]}", f"{MESH}.{BACKEND}:{self.admin_ports[BACKEND]}"]

    def preflight(self):
        if not (ROOT / self.hdsd).is_file():
            raise DemoError(f"no hdsd binary at {self.hdsd}: build it with `cargo build --release --bins` "
                            "(`make demo` does), or pass --hdsd PATH")
        self.envoy = find_envoy()
        if self.settings.auth_mode != "token":
            raise DemoError(f"{CONFIG} sets auth.mode = {self.settings.auth_mode!r}; the demo shows token auth")
        wanted = [(self.args.hds_port, "hdsd HDS (--hds-port)"), (self.args.api_port, "hdsd REST API (--api-port)")]
        wanted += [(p, f"demo app {n} (--app-ports)") for n, p in self.app_ports.items()]
        wanted += [(p, f"Envoy admin of {n} (--admin-ports)") for n, p in self.admin_ports.items()]
        wanted += [(self.args.front_port, "front Envoy's HTTP listener (--front-port)")]
        wanted += [(p, f"{n}'s inbound listener (its Dataplane's inbound port)")
                   for n, (p, _) in self.inbound_ports.items()]
        ports = [p for p, _ in wanted]
        if len(set(ports)) != len(ports):
            raise DemoError(f"the demo's ports must all differ: {ports}")
        busy = [f"  127.0.0.1:{p} for the {what}" for p, what in wanted if not port_free(p)]
        if busy:
            raise DemoError(
                "these ports are in use (another demo still running? see `ss -ltnp`):\n" + "\n".join(busy)
                + "\nstop what holds them or choose other ports with the options named above (./scripts/demo.py --help)")

    def prepare(self):
        work = ROOT / WORK
        if work.exists():
            shutil.rmtree(work)
        for sub in ("logs", "dataplanes", "bootstrap", "state"):
            (work / sub).mkdir(parents=True)
        # The example dataplanes, with the app ports this run uses.
        mapping = dict(zip(EXAMPLE_APP_PORTS, self.args.app_ports))
        files = sorted((ROOT / EXAMPLE_DATAPLANES).glob("*.yaml"))
        seen = set()
        for f in files:
            def swap(m):
                seen.add(int(m.group(2)))
                return f"{m.group(1)}{mapping.get(int(m.group(2)), int(m.group(2)))}"
            text = re.sub(r"(servicePort:\s*)(\d+)", swap, f.read_text())
            (work / "dataplanes" / f.name).write_text(text)
        if seen != set(EXAMPLE_APP_PORTS):
            raise DemoError(f"{EXAMPLE_DATAPLANES}/ uses servicePorts {sorted(seen)}; the demo expects "
                            f"{list(EXAMPLE_APP_PORTS)}: update EXAMPLE_APP_PORTS in scripts/demo.py")
        (work / "dataplanes" / f"{WEB2}.yaml").write_text(
            WEB2_FILE.format(inbound=WEB2_INBOUND, app_port=self.app_ports["web-2"]))
        self.sup.run("hdsd validate", [self.hdsd, "validate", "--config", CONFIG], WORK / "logs/hdsd-validate.log")
        # Key, tokens and bootstraps: the same script as docker-compose.yml's hdsd-init.
        self.sup.run("docker/hdsd-init.sh", self.init_argv(), WORK / "logs/hdsd-init.log")
        # The intruder: claims to be backend-01 but holds web-01's (valid) token.
        self.sup.run("hdsd bootstrap (intruder)",
                     [self.hdsd, "bootstrap", "--mesh", MESH, "--name", BACKEND, "--server", self.hds,
                      "--token-file", WORK / f"bootstrap/tokens/{MESH}.{WEB}.jwt",
                      "--admin-port", self.admin_ports["intruder"], "--out", WORK / "bootstrap/intruder.yaml"],
                     WORK / "logs/hdsd-bootstrap-intruder.log")
        # web-02 is the demo's own: its token and bootstrap by the same commands the init script runs.
        token = WORK / f"bootstrap/tokens/{MESH}.{WEB2}.jwt"
        self.sup.run("hdsd token issue (web-02)",
                     ["sh", "-c", f'umask 077 && "$0" token issue --config "$1" --mesh {MESH} --name {WEB2} '
                      f'--valid-for 24h > "$2"', self.hdsd, CONFIG, token],
                     WORK / "logs/hdsd-token-web-02.log")
        self.sup.run("hdsd bootstrap (web-02)",
                     [self.hdsd, "bootstrap", "--mesh", MESH, "--name", WEB2, "--server", self.hds,
                      "--token-file", token, "--admin-port", self.admin_ports[WEB2],
                      "--out", WORK / f"bootstrap/{MESH}.{WEB2}.yaml"],
                     WORK / "logs/hdsd-bootstrap-web-02.log")
        # The front proxy: routes to the EDS cluster default/web, fed by hdsd.
        front_token = WORK / "bootstrap/tokens/front.token"
        (ROOT / front_token).write_text(self.eds_token + "\n")
        os.chmod(ROOT / front_token, 0o600)
        self.sup.run("hdsd bootstrap front",
                     [self.hdsd, "bootstrap", "front", "--service", "web", "--mesh", MESH,
                      "--listen", f"127.0.0.1:{self.args.front_port}", "--server", self.hds,
                      "--token-file", front_token, "--admin-port", self.admin_ports["front"],
                      "--out", WORK / "bootstrap/front.yaml"],
                     WORK / "logs/hdsd-bootstrap-front.log")
        say(f"    key, tokens and bootstraps made by {INIT_SCRIPT} in {WORK}/bootstrap/ (log: {WORK}/logs/hdsd-init.log)")

    def start_hdsd(self):
        self.hdsd_proc = self.sup.start("hdsd", [self.hdsd, "serve", "--config", CONFIG], WORK / "logs/hdsd.log")
        secs, _ = wait_until(self.sup, "hdsd /readyz", 20, lambda: (http_get(self.api + "/readyz")[0] == 200, "not ready"))
        say(f"    hdsd is up in {secs:.1f}s (pid {self.hdsd_proc.pid}): HDS on {self.hds}, API on {self.api}")
        status, body = http_get(self.page_url())
        if status != 200 or "<title>hdsd fleet</title>" not in body:
            raise DemoError(f"GET {self.page_url()} answered {status}, not the fleet page")
        say(f"    the fleet page is served at {self.page_url()}: open it to watch the story live")

    def page_url(self):
        return self.api + "/ui/"

    def start_app(self, key):
        port = self.app_ports[key]
        proc = self.sup.start(f"app {key}", [sys.executable, "scripts/demo_app.py", "--port", port, "--name", key],
                              WORK / f"logs/app-{key}.log")
        wait_until(self.sup, f"app {key} on 127.0.0.1:{port}", 10, lambda: (accepting(port), "not accepting"))
        self.apps[key] = proc
        return proc

    def start_envoy(self, key, bootstrap):
        argv = [self.envoy, "-c", bootstrap, "--use-dynamic-base-id", "--log-level", "info"]
        if key in self.inbound_ports:
            argv += ["--config-yaml", json.dumps(sidecar_inbound(*self.inbound_port_and_app(key)))]
        return self.sup.start(f"envoy {key}", argv, WORK / f"logs/envoy-{key}.log")

    def inbound_port_and_app(self, key):
        port, app = self.inbound_ports[key]
        return port, self.app_ports[app]

    # -- API views

    def dataplanes(self):
        return {f"{d['mesh']}.{d['name']}": d for d in get_json(self.api + "/api/v1/dataplanes")["items"]}

    def inbound(self, dps, name, port):
        for i in dps[f"{MESH}.{name}"]["inbounds"]:
            if i["port"] == port:
                return i
        raise DemoError(f"{MESH}.{name} has no inbound {port}")

    def readiness(self):
        dps = self.dataplanes()
        return {(name, i["port"]): (i["health"]["ready"], i["health"]["status"])
                for name in (WEB, BACKEND, WEB2) for i in dps.get(f"{MESH}.{name}", {"inbounds": []})["inbounds"]}

    # -- the story

    def step_a(self):
        step_line("(a) hdsd sends each Envoy its health checks; Envoy probes the apps and reports: "
                  "waiting for all 4 inbounds to be ready, then for the front Envoy to route to both web apps")
        t0 = time.monotonic()
        for name in (WEB, BACKEND, WEB2):
            self.envoys[name] = self.start_envoy(name, WORK / f"bootstrap/{MESH}.{name}.yaml")

        def all_ready():
            r = self.readiness()
            return len(r) == 4 and all(ready for ready, _ in r.values()), r
        wait_until(self.sup, "every inbound ready", 30, all_ready)
        secs = time.monotonic() - t0
        # The front proxy: its endpoints come from hdsd's EDS, with health from readiness.
        self.envoys["front"] = self.sup.start(
            "envoy front", [self.envoy, "-c", WORK / "bootstrap/front.yaml", "--use-dynamic-base-id",
                            "--log-level", "info"], WORK / "logs/envoy-front.log")
        wait_until(self.sup, "the front Envoy to get both web endpoints from hdsd (EDS), healthy", 30,
                   lambda: (lambda h: (h.get(WEB_INBOUND) == "healthy" and h.get(WEB2_INBOUND) == "healthy", h))(
                       self.front_health()))
        self.client = Client(self.front_url)

        def both_answer():
            answers, failures, last = self.client.counts()
            if failures:
                raise DemoError(f"a request through the front Envoy failed before anything was stopped: {last}")
            return answers.get("web", 0) > 0 and answers.get("web-2", 0) > 0, answers
        _, answers = wait_until(self.sup, "both web apps to answer through the front Envoy", 20, both_answer)
        self.record("a", True, secs,
                    f"all 4 inbounds ready {secs:.1f}s after starting the Envoys; the front Envoy "
                    f"({self.front_url}) takes web's endpoints from hdsd (EDS) and both web apps answer "
                    f"({CLIENT_RATE} requests/s)")

    def front_health(self):
        """{inbound port: health flags} of the web endpoints in the front Envoy's /clusters."""
        _, body = http_get(f"http://127.0.0.1:{self.admin_ports['front']}/clusters")
        flags = {}
        for line in body.splitlines():
            m = re.match(r"^[^:]+/web::127\.0\.0\.1:(\d+)::health_flags::(.*)$", line)
            if m:
                flags[int(m.group(1))] = m.group(2)
        return flags

    def traffic_note(self, since):
        """What the client saw since the `since` counts snapshot, and whether none failed."""
        answers, failures, last = self.client.counts()
        before, _, _ = since
        delta = {app: n - before.get(app, 0) for app, n in answers.items() if n - before.get(app, 0)}
        total = sum(answers.values()) + failures
        owner = {"web": WEB, "web-2": WEB2}
        text = (f"front: {sum(delta.values())} requests since, answered by "
                + ", ".join(f"{owner.get(app, app)}'s app {n}" for app, n in sorted(delta.items()))
                + f"; failed requests over the whole story: {failures} of {total}"
                + (f" (last: {last})" if failures else ""))
        return text, failures == 0

    def step_b(self):
        s = self.settings
        worst = s.worst_case_detection()
        step_line(f"(b) stopping the web app (127.0.0.1:{self.app_ports['web']}): "
                  f"web-01's inbound must turn not ready within {fmt_s(worst)} ({s.formula()}); "
                  f"on the fleet page ({self.page_url()}) its row turns red, without a reload; "
                  f"the front Envoy stops sending it requests and not one request fails")
        counts_at_stop = self.client.counts()
        self.sup.stop(self.apps["web"])
        t_stop = time.monotonic()
        secs, seen = wait_until(
            self.sup, "web-01's inbound to be not ready", worst + 10,
            lambda: (lambda i: (not i["health"]["ready"], i["health"]))(self.inbound(self.dataplanes(), WEB, WEB_INBOUND)))
        others = self.readiness()
        still = [k for k in ((BACKEND, API_INBOUND), (BACKEND, ADMIN_INBOUND), (WEB2, WEB2_INBOUND))
                 if not others.get(k, (False,))[0]]
        within = secs <= worst + MEASUREMENT_SLACK
        note = (f"web-01:{WEB_INBOUND} not ready ({seen['status']}) {secs:.1f}s after the app stopped; "
                f"documented worst case {fmt_s(worst)}"
                + (" - within it" if within else f" - {secs - worst:.1f}s OVER it"))
        if still:
            note += f"; but inbounds {still} are not ready either"
        else:
            note += "; backend-01's 2 inbounds and web-02 stay ready"
        # The front Envoy learns it over EDS and stops sending web-01 requests.
        wait_until(self.sup, "the front Envoy to mark web-01's endpoint unhealthy", 10,
                   lambda: (lambda h: ("failed_eds_health" in h.get(WEB_INBOUND, ""), h))(self.front_health()))
        marked_at = time.monotonic() - t_stop
        after_mark = self.client.counts()[0].get("web-2", 0)
        wait_until(self.sup, "web-02 to answer a second of requests through the front", 10,
                   lambda: (lambda n: (n - after_mark >= CLIENT_RATE, n - after_mark))(
                       self.client.counts()[0].get("web-2", 0)))
        traffic, none_failed = self.traffic_note(counts_at_stop)
        note += (f"; the front Envoy marked web-01 unhealthy (EDS) {marked_at:.1f}s after the app stopped; "
                 + traffic)
        self.record("b", within and not still and none_failed, secs, note)

    def step_c(self):
        bound = self.settings.worst_case_recovery()
        step_line(f"(c) starting the web app again: web-01's inbound becomes ready "
                  f"(expected within {fmt_s(bound)}: healthy_threshold x no_traffic_interval + timeout + report_interval)")
        counts_at_start = self.client.counts()
        self.start_app("web")
        t0 = time.monotonic()
        wait_until(self.sup, "web-01's inbound to be ready", bound + 10,
                   lambda: (lambda i: (i["health"]["ready"], i["health"]))(self.inbound(self.dataplanes(), WEB, WEB_INBOUND)))
        secs = time.monotonic() - t0
        wait_until(self.sup, "web-01's app to answer through the front Envoy again", 10,
                             lambda: (lambda a: (a.get("web", 0) > counts_at_start[0].get("web", 0), a))(
                                 self.client.counts()[0]))
        back = time.monotonic() - t0
        traffic, none_failed = self.traffic_note(counts_at_start)
        self.record("c", none_failed, secs,
                    f"web-01:{WEB_INBOUND} ready again {secs:.1f}s after the app started; the front Envoy "
                    f"sends it requests again {back:.1f}s after; {traffic}")

    def step_d(self):
        step_line(f"(d) a third Envoy claims to be {MESH}.{BACKEND} but holds {MESH}.{WEB}'s token: "
                  "hdsd must refuse it and keep backend-01's own Envoy")
        before = self.dataplanes()[f"{MESH}.{BACKEND}"]["connection"]
        if not before["connected"]:
            raise DemoError(f"backend-01 is not connected before the intruder starts: {before}")
        log = WORK / "logs/envoy-intruder.log"
        t0 = time.monotonic()
        intruder = self.start_envoy("intruder", WORK / "bootstrap/intruder.yaml")
        marker = "StreamHealthCheck gRPC config stream closed"

        def refused():
            text = (ROOT / log).read_text(errors="replace")
            lines = [percent_decode(line) for line in text.splitlines() if marker in line]
            return bool(lines), (lines[0] if lines else "no such line in the Envoy log yet")
        secs, line = wait_until(self.sup, "the intruder Envoy to be refused", 20, refused)
        after = self.dataplanes()[f"{MESH}.{BACKEND}"]["connection"]
        self.sup.stop(intruder)
        # Envoy appends the response's details in braces ({via_upstream}).
        m = re.search(r"closed: (\d+), (.*?)(\{[a-z_]+\})?$", line)
        code, reason = (int(m.group(1)), m.group(2).strip()) if m else (None, line)
        names = {7: "PERMISSION_DENIED", 16: "UNAUTHENTICATED"}
        refused_ok = code in names
        kept = after["connected"] and after["connectedAt"] == before["connectedAt"]
        say(f"    Envoy log (percent-decoded): {marker}: {code}, {reason}")
        for entry in strip_ansi((ROOT / WORK / "logs/hdsd.log").read_text(errors="replace")).splitlines():
            if "cannot be used by" in entry or ("ending stream" in entry and "token" in entry):
                say(f"    hdsd log: {entry.strip()}")
                break
        metric = self.auth_failures()
        if metric:
            say(f"    /metrics: {metric}")
        note = (f"refused after {secs:.1f}s with {names.get(code, f'gRPC status {code}')}: \"{reason}\"; "
                + (f"hdsd lists no connection for it: backend-01 is still served by its own Envoy "
                   f"(connected since {after['connectedAt']})" if kept
                   else f"but backend-01's connection changed: before {before}, after {after}"))
        self.record("d", refused_ok and kept, secs, note)

    def auth_failures(self):
        try:
            status, body = http_get(self.api + "/metrics")
        except (OSError, urllib.error.URLError):
            return None
        if status != 200:
            return None
        lines = [line for line in body.splitlines() if line.startswith("hdsd_auth_failures_total")]
        return ", ".join(lines) or None

    # -- modes

    def where_to_look(self):
        say("Where to look (in another terminal) while the story runs:")
        say(f"  {self.page_url()}   (the fleet page, in a browser)")
        binary = str(self.hdsd) if self.hdsd.is_absolute() else f"./{self.hdsd}"
        say(f"  {binary} status --watch --api {self.api}")
        say(f"  curl -s {self.front_url}   (the front Envoy: web-01 and web-02 answer in turn)")
        say(f"  curl -s {self.api}/api/v1/dataplanes")
        say(f"  curl -s {self.api}/metrics")
        say(f"  logs: {WORK}/logs/ (hdsd.log, envoy-*.log, app-*.log)")

    def run(self):
        say(f"Fleet page: {self.page_url()} (open it in a browser; it follows the story live)")
        say(f"hdsd demo: hdsd (token auth) + Envoys {WEB}, {BACKEND}, {WEB2} + 4 apps + a front Envoy "
            f"on {self.front_url} (EDS from hdsd); work dir {WORK}/")
        self.preflight()
        if not self.once:
            self.where_to_look()
        step_line("setting up: signing key, tokens, bootstraps, hdsd, the 4 demo apps")
        self.prepare()
        self.start_hdsd()
        for key in self.app_ports:
            self.start_app(key)
        say("    apps: " + ", ".join(f"{k} 127.0.0.1:{p}" for k, p in self.app_ports.items()))
        self.run_steps()
        answers, failures, _ = self.client.counts()
        self.client.stop()
        say(f"    the client stopped: {sum(answers.values()) + failures} requests through the front Envoy, "
            f"{failures} failed")
        if self.once:
            return
        step_line(f"the story is over: the live table (`hdsd status --watch`) follows in 3s. In another terminal, "
                  f"`kill {self.apps['web'].pid}` stops the web app: watch web-01 turn not ready here and on "
                  f"{self.page_url()}. Ctrl-C stops everything")
        time.sleep(3)
        watch = subprocess.Popen([str(self.hdsd), "status", "--watch", "--api", self.api],
                                 cwd=ROOT, env=self.sup.env, start_new_session=True,
                                 preexec_fn=die_with_parent)
        self.sup.procs.append(_Adopted("hdsd status --watch", watch))
        watch.wait()
        raise DemoError(f"`hdsd status --watch` exited ({watch.returncode})")


# ---------------------------------------------------------------- the zones story (--zones)

ZONES = ("eu-1", "us-1")
# The front Envoy's zone: the global hands it eu-1's endpoints at priority 0,
# us-1's at priority 1.
FRONT_ZONE, OTHER_ZONE = "eu-1", "us-1"
# The zone whose hdsd the story freezes.
FROZEN_ZONE = "us-1"
# (zone, dataplane): each one web app behind its own sidecar Envoy, all of service web.
ZONE_BACKENDS = (("eu-1", "web-01"), ("eu-1", "web-02"), ("us-1", "web-03"))
# The global's timings, as short as its rules allow (heartbeat_interval >= 1s,
# zone_timeout >= 2 x heartbeat_interval, offline_ttl >= zone_timeout). A
# frozen zone reads offline within zone_timeout + 1s (docs/zones.md).
HEARTBEAT_INTERVAL, ZONE_TIMEOUT, OFFLINE_TTL = 1.0, 3.0, 60.0
ZONES_PORT_BASE = 16700
# A window in which every answer must come from one zone (25 requests at 50/s).
ZONE_WINDOW = 0.5

GLOBAL_CONFIG = """# Written by scripts/demo.py --zones: the global hdsd. It accepts the zones'
# streams on global.listen (a zone is known by its zone token, hence token
# auth), lists them in GET /api/v1/zones, and serves every zone's endpoints
# over EDS on hds.listen to the front Envoy (with its eds.tokens token).
state_dir = "{dir}/state"

[hds]
listen = "127.0.0.1:{hds}"

[auth]
mode = "token"

[api]
listen = "127.0.0.1:{api}"

[dataplanes]
dir = "{dir}/dataplanes"

[global]
enabled = true
listen = "127.0.0.1:{zones}"
heartbeat_interval = "{heartbeat}"
zone_timeout = "{zone_timeout}"
offline_ttl = "{offline_ttl}"
zones = [{names}]

[eds]
tokens = ["{front_token}"]

[log]
level = "info"
"""

ZONE_CONFIG = """# Written by scripts/demo.py --zones: zone {zone}. It serves its own Envoys
# (with no token: auth.mode is about them only) and reports their readiness to
# the global with the zone token the global issued. Check timings as in
# {example}.
state_dir = "{dir}/state"

[hds]
listen = "127.0.0.1:{hds}"
report_interval = "{report_interval}"

[hds.check]
interval = "{interval}"
timeout = "{timeout}"
healthy_threshold = {healthy}
unhealthy_threshold = {unhealthy}

[auth]
mode = "none"

[api]
listen = "127.0.0.1:{api}"

[dataplanes]
dir = "{dir}/dataplanes"

[zone]
name = "{zone}"
global = ["http://127.0.0.1:{global_port}"]
token_file = "{dir}/zone.token"

[log]
level = "info"
"""

ZONE_DATAPLANE = """# Written by scripts/demo.py --zones: {name} in zone {zone}; its sidecar
# Envoy's inbound listener {inbound} proxies to its app on {app_port}.
""" + WEB_DATAPLANE


class Backend:
    """One web app of a zone, its dataplane and its sidecar Envoy."""

    def __init__(self, zone, name, port):
        self.zone, self.name = zone, name
        self.app = f"{zone}/{name}"  # what the app answers: "hello from eu-1/web-01"
        self.key = f"{zone}-{name}"  # its log files
        self.app_port = port[f"{self.app} app"]
        self.inbound = port[f"{self.app} inbound"]
        self.admin = port[f"{self.app} admin"]


def zones_ports(base):
    """Every port of the zones story, a block from `base`: {key: (port, what uses it)}."""
    wanted = [("global hds", "the global's HDS/EDS listener"), ("global api", "the global's REST API"),
              ("global zones", "the global's zone listener")]
    for zone in ZONES:
        wanted += [(f"{zone} hds", f"{zone}'s HDS listener"), (f"{zone} api", f"{zone}'s REST API")]
    wanted += [("front", "the front Envoy's HTTP listener"), ("front admin", "the front Envoy's admin")]
    for zone, name in ZONE_BACKENDS:
        wanted += [(f"{zone}/{name} app", f"{zone}/{name}'s app"),
                   (f"{zone}/{name} inbound", f"{zone}/{name}'s inbound listener (its sidecar Envoy)"),
                   (f"{zone}/{name} admin", f"{zone}/{name}'s Envoy admin")]
    return {key: (base + i, what) for i, (key, what) in enumerate(wanted)}


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def parse_time(text):
    """An RFC 3339 time of the API (nanoseconds, Z) as a Unix timestamp."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.datetime.fromisoformat(m.group(1) + zone).timestamp() + float("0." + (m.group(2) or "0"))


def zone_of(app):
    """The zone of an app as it answers ("eu-1/web-01" -> "eu-1")."""
    return app.split("/", 1)[0]


def by_zone(answers, before=None):
    """Answers per zone, counted since the `before` answers when given."""
    before = before or {}
    out = {}
    for app, n in answers.items():
        if n - before.get(app, 0):
            out[zone_of(app)] = out.get(zone_of(app), 0) + n - before.get(app, 0)
    return out


class ZonesDemo(Story):
    """A global hdsd, two zone hdsds with their sidecar Envoys and apps, and a
    front Envoy in eu-1 fed by the global's EDS."""

    STEPS = "abcdef"
    NAME = "zones story"

    def __init__(self, args):
        self.args = args
        self.once = args.once
        self.hdsd = Path(args.hdsd)
        # The zones check their Envoys with the example's timings, as the single-zone story does.
        self.example = Settings(CONFIG)
        self.ports = zones_ports(args.zones_port_base)
        self.port = {key: p for key, (p, _) in self.ports.items()}
        self.backends = [Backend(zone, name, self.port) for zone, name in ZONE_BACKENDS]
        self.api = {node: f"http://127.0.0.1:{self.port[node + ' api']}" for node in ("global",) + ZONES}
        self.global_api = self.api["global"]
        self.front_url = f"http://127.0.0.1:{self.port['front']}/"
        self.front_admin = f"http://127.0.0.1:{self.port['front admin']}"
        self.front_token = "demo-front-" + secrets.token_hex(16)
        self.results = []
        self.sup = Supervisor({k: v for k, v in os.environ.items() if not k.startswith("HDSD_")})
        self.hdsds = {}  # "global" or a zone -> Proc
        self.apps = {}   # Backend.key -> Proc
        self.envoys = {}
        self.zone_settings = {}
        self.client = None

    def in_zone(self, zone):
        return [b for b in self.backends if b.zone == zone]

    def config(self, node):
        return WORK / node / "hdsd.toml"

    def page_url(self):
        return self.global_api + "/ui/"

    def failure_logs(self):
        return [(f"the {node} hdsd's log", WORK / f"logs/hdsd-{node}.log") for node in ("global",) + ZONES]

    # -- setup

    def preflight(self):
        if not (ROOT / self.hdsd).is_file():
            raise DemoError(f"no hdsd binary at {self.hdsd}: build it with `cargo build --release --bins` "
                            "(`make demo` does), or pass --hdsd PATH")
        self.envoy = find_envoy()
        busy = [f"  127.0.0.1:{p} for {what}" for p, what in self.ports.values() if not port_free(p)]
        if busy:
            first, last = min(self.port.values()), max(self.port.values())
            raise DemoError(
                "these ports are in use (another demo still running? see `ss -ltnp`):\n" + "\n".join(busy)
                + f"\nstop what holds them or move the story's block of ports ({first}-{last}) with --zones-port-base")

    def prepare(self):
        work = ROOT / WORK
        if work.exists():
            shutil.rmtree(work)
        (work / "logs").mkdir(parents=True)
        for node in ("global",) + ZONES:
            for sub in ("state", "dataplanes", "bootstrap"):
                (work / node / sub).mkdir(parents=True)
        (ROOT / self.config("global")).write_text(GLOBAL_CONFIG.format(
            dir=WORK / "global", hds=self.port["global hds"], api=self.port["global api"],
            zones=self.port["global zones"], heartbeat=fmt_s(HEARTBEAT_INTERVAL), zone_timeout=fmt_s(ZONE_TIMEOUT),
            offline_ttl=fmt_s(OFFLINE_TTL), names=", ".join(f'"{z}"' for z in ZONES), front_token=self.front_token))
        os.chmod(ROOT / self.config("global"), 0o600)  # it holds the front's EDS token
        self.sup.run("hdsd token keygen (global)", [self.hdsd, "token", "keygen", "--config", self.config("global")],
                     WORK / "logs/hdsd-keygen-global.log")
        self.sup.run("hdsd validate (global)", [self.hdsd, "validate", "--config", self.config("global")],
                     WORK / "logs/hdsd-validate-global.log")
        ex = self.example
        for zone in ZONES:
            # The zone token, issued by the global (its signing key) for mesh default.
            self.sup.run(f"hdsd token issue --zone {zone}",
                         ["sh", "-c", 'umask 077 && "$0" token issue --config "$1" --zone "$2" --mesh default '
                          '--valid-for 24h > "$3"', self.hdsd, self.config("global"), zone, WORK / zone / "zone.token"],
                         WORK / f"logs/hdsd-token-{zone}.log")
            (ROOT / self.config(zone)).write_text(ZONE_CONFIG.format(
                zone=zone, example=CONFIG, dir=WORK / zone, hds=self.port[f"{zone} hds"], api=self.port[f"{zone} api"],
                report_interval=fmt_s(ex.report_interval), interval=fmt_s(ex.interval), timeout=fmt_s(ex.timeout),
                healthy=ex.healthy_threshold, unhealthy=ex.unhealthy_threshold, global_port=self.port["global zones"]))
            self.sup.run(f"hdsd validate ({zone})", [self.hdsd, "validate", "--config", self.config(zone)],
                         WORK / f"logs/hdsd-validate-{zone}.log")
            self.zone_settings[zone] = Settings(self.config(zone))
        for b in self.backends:
            (work / b.zone / "dataplanes" / f"{b.name}.yaml").write_text(ZONE_DATAPLANE.format(
                name=b.name, zone=b.zone, inbound=b.inbound, app_port=b.app_port))
            self.sup.run(f"hdsd bootstrap ({b.app})",
                         [self.hdsd, "bootstrap", "--mesh", MESH, "--name", b.name,
                          "--server", f"127.0.0.1:{self.port[b.zone + ' hds']}", "--admin-port", b.admin,
                          "--out", WORK / b.zone / f"bootstrap/{b.name}.yaml"],
                         WORK / f"logs/hdsd-bootstrap-{b.key}.log")
        # The front proxy in eu-1: routes to the EDS cluster default/web, fed by the global.
        front_token = WORK / "global/front.token"
        (ROOT / front_token).write_text(self.front_token + "\n")
        os.chmod(ROOT / front_token, 0o600)
        self.sup.run(f"hdsd bootstrap front --zone {FRONT_ZONE}",
                     [self.hdsd, "bootstrap", "front", "--service", "web", "--mesh", MESH, "--zone", FRONT_ZONE,
                      "--listen", f"127.0.0.1:{self.port['front']}", "--server", f"127.0.0.1:{self.port['global hds']}",
                      "--token-file", front_token, "--admin-port", self.port["front admin"],
                      "--out", WORK / "global/bootstrap/front.yaml"],
                     WORK / "logs/hdsd-bootstrap-front.log")
        say(f"    the global's signing key, a zone token per zone (`hdsd token issue --zone`), configs and "
            f"bootstraps in {WORK}/global/, {WORK}/eu-1/, {WORK}/us-1/")

    def start_hdsd(self, node):
        proc = self.sup.start(f"hdsd ({node})", [self.hdsd, "serve", "--config", self.config(node)],
                              WORK / f"logs/hdsd-{node}.log")
        secs, _ = wait_until(self.sup, f"the {node} hdsd's /readyz", 20,
                             lambda: (http_get(self.api[node] + "/readyz")[0] == 200, "not ready"))
        self.hdsds[node] = proc
        if node == "global":
            say(f"    the global is up in {secs:.1f}s (pid {proc.pid}): zone listener 127.0.0.1:{self.port['global zones']}, "
                f"EDS on 127.0.0.1:{self.port['global hds']}, API on {self.api[node]}")
        else:
            say(f"    zone {node}'s hdsd is up in {secs:.1f}s (pid {proc.pid}): HDS on 127.0.0.1:{self.port[node + ' hds']}, "
                f"API on {self.api[node]}")

    def start_app(self, b):
        proc = self.sup.start(f"app {b.app}", [sys.executable, "scripts/demo_app.py", "--port", b.app_port, "--name", b.app],
                              WORK / f"logs/app-{b.key}.log")
        wait_until(self.sup, f"app {b.app} on 127.0.0.1:{b.app_port}", 10, lambda: (accepting(b.app_port), "not accepting"))
        self.apps[b.key] = proc

    def start_envoy(self, b):
        argv = [self.envoy, "-c", WORK / b.zone / f"bootstrap/{b.name}.yaml", "--use-dynamic-base-id",
                "--log-level", "info", "--concurrency", "1",
                "--config-yaml", json.dumps(sidecar_inbound(b.inbound, b.app_port))]
        self.envoys[b.key] = self.sup.start(f"envoy {b.app}", argv, WORK / f"logs/envoy-{b.key}.log")

    # -- API views

    def zones(self):
        """The global's zones: {name: item of GET /api/v1/zones}."""
        return {z["name"]: z for z in get_json(self.global_api + "/api/v1/zones")["items"]}

    def zone_items(self):
        """The global's GET /api/v1/dataplanes, by (zone, name); its own ones under zone None."""
        items = get_json(self.global_api + "/api/v1/dataplanes")["items"]
        return {((i.get("zone") or {}).get("name"), i["name"]): i for i in items}

    @staticmethod
    def at_global(items, b):
        """(zone state, every inbound ready) of a backend's dataplane at the global; (None, None) if not listed."""
        item = items.get((b.zone, b.name))
        if item is None:
            return None, None
        return item["zone"].get("state"), bool(item["inbounds"]) and all(i["health"]["ready"] for i in item["inbounds"])

    def front_hosts(self):
        """{inbound port: {stat or flag: value}} of the web endpoints in the front Envoy's /clusters."""
        _, body = http_get(self.front_admin + "/clusters")
        hosts = {}
        for line in body.splitlines():
            m = re.match(r"^[^:]+/web::127\.0\.0\.1:(\d+)::(\w+)::(.*)$", line)
            if m:
                hosts.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
        return hosts

    def front_flags(self, backends, wanted):
        """A wait_until check: every backend's health flags at the front satisfy `wanted`."""
        def check():
            hosts = self.front_hosts()
            flags = {b.app: hosts.get(b.inbound, {}).get("health_flags", "not listed") for b in backends}
            return all(wanted(f) for f in flags.values()), flags
        return check

    def only_from(self, zone, what, timeout):
        """Waits for a ZONE_WINDOW of client answers all from `zone` (at least 5);
        returns when that window began, in seconds from now."""
        start = time.monotonic()
        state = {"at": start, "answers": self.client.counts()[0], "last": "no window yet", "began": None}

        def check():
            now = time.monotonic()
            if now - state["at"] < ZONE_WINDOW:
                return False, state["last"]
            answers = self.client.counts()[0]
            window = by_zone(answers, state["answers"])
            state.update(began=state["at"] - start, at=now, answers=answers, last=f"last {ZONE_WINDOW:g}s: {window}")
            return window.get(zone, 0) >= 5 and sum(window.values()) == window[zone], state["last"]
        wait_until(self.sup, what, timeout, check)
        return state["began"]

    def traffic_note(self, since):
        """What the client saw since the `since` snapshot, and whether no request failed."""
        answers, failures, last = self.client.counts()
        delta = {app: n - since[0].get(app, 0) for app, n in sorted(answers.items()) if n - since[0].get(app, 0)}
        zones = by_zone(answers, since[0])
        total = sum(answers.values()) + failures
        text = (f"front: {sum(delta.values())} requests since, "
                + "; ".join(f"{z} {zones.get(z, 0)} ("
                            + ", ".join(f"{app.split('/')[1]} {n}" for app, n in delta.items() if zone_of(app) == z)
                            + ")" for z in ZONES if zones.get(z))
                + f"; failed requests over the whole story: {failures} of {total}"
                + (f" (last: {last})" if failures else ""))
        return text, failures == 0

    # -- the story

    def step_a(self):
        step_line(f"(a) each sidecar Envoy reports to its zone's hdsd, each zone reports to the global: waiting for "
                  f"both zones online at the global (GET {self.global_api}/api/v1/zones) and all "
                  f"{len(self.backends)} inbounds ready in its GET /api/v1/dataplanes, each marked with its zone")
        t0 = time.monotonic()
        for b in self.backends:
            self.start_envoy(b)

        def seen():
            zones = self.zones()
            items = self.zone_items()
            states = {z: zones.get(z, {}).get("state") for z in ZONES}
            uplinks = {z: get_json(self.api[z] + "/api/v1/zones")["uplink"]["connected"] for z in ZONES}
            dps = {b.app: self.at_global(items, b) for b in self.backends}
            done = (all(s == "online" for s in states.values()) and all(uplinks.values())
                    and all(d == ("online", True) for d in dps.values()))
            return done, {"zones": states, "uplinks connected": uplinks, "dataplanes (zone state, ready)": dps}
        wait_until(self.sup, "both zones online at the global, every inbound ready there", 30, seen)
        secs = time.monotonic() - t0
        zones = self.zones()
        for zone in ZONES:
            _, body = http_get(self.api[zone] + "/readyz")
            line = next((l.strip() for l in body.splitlines() if l.strip().startswith(f"zone {zone}:")), "no zone line")
            say(f"    {zone}'s /readyz: {line}")
        self.record("a", True, secs,
                    f"{secs:.1f}s after starting the Envoys: "
                    + "; ".join(f"{z} {zones[z]['state']} at the global ({plural(zones[z]['dataplanes'], 'dataplane')}, "
                                f"{zones[z]['inbounds']['ready']}/{zones[z]['inbounds']['total']} inbounds ready)"
                                for z in ZONES)
                    + "; its /api/v1/dataplanes lists " + ", ".join(f"{b.name} (zone {b.zone}, online, ready)"
                                                                    for b in self.backends))

    def step_b(self):
        step_line(f"(b) a front Envoy in {FRONT_ZONE} (`hdsd bootstrap front --service web --zone {FRONT_ZONE}`) takes "
                  f"web's endpoints from the global's EDS (127.0.0.1:{self.port['global hds']}): {FRONT_ZONE}'s at "
                  f"priority 0, {OTHER_ZONE}'s at priority 1; a client sends it {CLIENT_RATE} requests/s for the rest "
                  f"of the story, and {FRONT_ZONE}'s apps answer them all")
        t0 = time.monotonic()
        self.envoys["front"] = self.sup.start(
            "envoy front", [self.envoy, "-c", WORK / "global/bootstrap/front.yaml", "--use-dynamic-base-id",
                            "--log-level", "info", "--concurrency", "1"], WORK / "logs/envoy-front.log")
        wait_until(self.sup, "the front Envoy to get every zone's web endpoint from the global, healthy", 30,
                   self.front_flags(self.backends, lambda f: f == "healthy"))
        secs = time.monotonic() - t0
        hosts = self.front_hosts()
        placed = {b.app: (hosts[b.inbound].get("zone"), hosts[b.inbound].get("priority")) for b in self.backends}
        wrong = [f"{app} in zone {z!r} at priority {p!r}" for app, (z, p) in placed.items()
                 if (z, p) != (zone_of(app), "0" if zone_of(app) == FRONT_ZONE else "1")]
        self.client = Client(self.front_url)
        # The front's first requests may meet a sidecar whose inbound
        # listener is still starting; its retry then goes to the next
        # priority (us-1). Wait for the traffic to settle in the front's
        # zone (a half-second window answered there only), then count.
        def settled():
            before = self.client.counts()[0]
            time.sleep(0.5)  # the window measured, not a wait for an event
            window = {k: v - before.get(k, 0) for k, v in self.client.counts()[0].items()}
            here = by_zone(window)
            return (here.get(FRONT_ZONE, 0) > 0 and not here.get(OTHER_ZONE)), here
        wait_until(self.sup, f"the front's traffic to settle in {FRONT_ZONE}", 15, settled)
        base_answers, base_failures, _ = self.client.counts()
        wait_until(self.sup, f"{2 * CLIENT_RATE} requests through the front Envoy", 20,
                   lambda: (lambda c: (sum(c[0].values()) - sum(base_answers.values()) + c[1] - base_failures
                                       >= 2 * CLIENT_RATE, c[:2]))(self.client.counts()))
        answers, failures, last = self.client.counts()
        answers = {k: v - base_answers.get(k, 0) for k, v in answers.items() if v - base_answers.get(k, 0)}
        failures -= base_failures
        zones = by_zone(answers)
        local = [b.app for b in self.in_zone(FRONT_ZONE)]
        passed = not wrong and failures == 0 and not zones.get(OTHER_ZONE) and all(answers.get(a) for a in local)
        note = (f"the front has the {len(self.backends)} endpoints healthy {secs:.1f}s after it started: "
                + ", ".join(f"{app} zone {z} priority {p}" for app, (z, p) in placed.items())
                + (f" (expected otherwise: {wrong})" if wrong else "")
                + f"; {sum(answers.values()) + failures} requests once settled: "
                + ", ".join(f"{app} {n}" for app, n in sorted(answers.items()))
                + f", {OTHER_ZONE} {zones.get(OTHER_ZONE, 0)}, failed {failures}" + (f" (last: {last})" if failures else ""))
        self.record("b", passed, secs, note)

    def step_c(self):
        local = self.in_zone(FRONT_ZONE)
        s = self.zone_settings[FRONT_ZONE]
        worst = s.worst_case_detection()
        step_line(f"(c) stopping both of {FRONT_ZONE}'s web apps: their inbounds must turn not ready at the global within "
                  f"{fmt_s(worst)} (the zone's detection: {s.formula()}), the front Envoy marks them unhealthy (EDS), "
                  f"every request goes to {OTHER_ZONE} and not one fails (the front retries into the next priority)")
        since = self.client.counts()
        for b in local:
            self.sup.stop(self.apps[b.key])
        t0 = time.monotonic()
        # Measured from the stop by a poll of its own: the wait for the
        # traffic below must not delay when the global is seen not ready.
        at_global = Background(lambda: self.wait_at_global(local, False, worst + 10))
        moved = self.only_from(OTHER_ZONE, f"every answer to come from {OTHER_ZONE}", worst + 5)
        at_global = at_global.result() - t0
        wait_until(self.sup, f"the front Envoy to mark {FRONT_ZONE}'s endpoints unhealthy", 10,
                   self.front_flags(local, lambda f: "failed_eds_health" in f))
        marked = time.monotonic() - t0
        self.only_from(OTHER_ZONE, f"every answer still from {OTHER_ZONE} once {FRONT_ZONE} is marked unhealthy", 10)
        traffic, none_failed = self.traffic_note(since)
        within = at_global <= worst + MEASUREMENT_SLACK
        self.record("c", within and none_failed, at_global,
                    f"every answer from {OTHER_ZONE} from {moved:.1f}s after the apps stopped; {FRONT_ZONE}'s "
                    f"{len(local)} inbounds not ready at the global {at_global:.1f}s after (documented worst case "
                    f"{fmt_s(worst)}" + (" - within it" if within else f" - {at_global - worst:.1f}s OVER it")
                    + f"); the front marked them unhealthy (EDS) {marked:.1f}s after; {traffic}")

    def wait_at_global(self, backends, ready, timeout):
        """Waits until every one of `backends` reads `ready` at the global;
        returns the monotonic time it was seen."""
        def check():
            items = self.zone_items()
            got = {b.app: self.at_global(items, b) for b in backends}
            return all(r is ready for _, r in got.values()), got
        word = "ready" if ready else "not ready"
        wait_until(self.sup, f"{FRONT_ZONE}'s inbounds to read {word} at the global", timeout, check)
        return time.monotonic()

    def step_d(self):
        local = self.in_zone(FRONT_ZONE)
        bound = self.zone_settings[FRONT_ZONE].worst_case_recovery()
        step_line(f"(d) starting {FRONT_ZONE}'s apps again: their inbounds are ready again at the global (expected within "
                  f"{fmt_s(bound)}), the front marks them healthy and {FRONT_ZONE} answers everything again")
        since = self.client.counts()
        for b in local:
            self.start_app(b)
        t0 = time.monotonic()

        self.wait_at_global(local, True, bound + 10)
        at_global = time.monotonic() - t0
        wait_until(self.sup, f"the front Envoy to mark {FRONT_ZONE}'s endpoints healthy", 10,
                   self.front_flags(local, lambda f: f == "healthy"))
        marked = time.monotonic() - t0
        back = marked + self.only_from(FRONT_ZONE, f"every answer to come from {FRONT_ZONE} again", 10)
        traffic, none_failed = self.traffic_note(since)
        self.record("d", none_failed, at_global,
                    f"{FRONT_ZONE}'s inbounds ready at the global {at_global:.1f}s after the apps started; the front "
                    f"marked them healthy {marked:.1f}s after, and every answer came from {FRONT_ZONE} again from "
                    f"{back:.1f}s; {traffic}")

    def step_e(self):
        proc = self.hdsds[FROZEN_ZONE]
        frozen = self.in_zone(FROZEN_ZONE)
        limit = ZONE_TIMEOUT + 1
        step_line(f"(e) freezing {FROZEN_ZONE}'s hdsd (SIGSTOP to pid {proc.pid}: its connection to the global stays "
                  f"open, nothing crosses it): the global must read {FROZEN_ZONE} offline within zone_timeout "
                  f"{fmt_s(ZONE_TIMEOUT)} + 1s, keep its dataplanes with their last readiness and hand the front their "
                  f"endpoints as degraded (eds.offline_zone); {FRONT_ZONE} stays online and answers everything")
        since = self.client.counts()
        proc.signal_group(signal.SIGSTOP)
        t0, stopped_at = time.monotonic(), time.time()
        wait_until(self.sup, f"{FROZEN_ZONE} to read offline at the global", ZONE_TIMEOUT + 5,
                   lambda: (lambda z: (z["state"] == "offline", {"state": z["state"], "lastSeen": z.get("lastSeen")}))(
                       self.zones()[FROZEN_ZONE]))
        secs = time.monotonic() - t0
        zones = self.zones()
        items = self.zone_items()
        kept = {b.app: self.at_global(items, b) for b in frozen}
        kept_ok = all(k == ("offline", True) for k in kept.values()) and not zones[FROZEN_ZONE]["withdrawn"]
        others = {z: zones[z]["state"] for z in ZONES if z != FROZEN_ZONE}
        wait_until(self.sup, f"the front Envoy to hold {FROZEN_ZONE}'s endpoints as degraded", 10,
                   self.front_flags(frozen, lambda f: "degraded_eds_health" in f))
        degraded = time.monotonic() - t0
        self.only_from(FRONT_ZONE, f"every answer from {FRONT_ZONE}", 5)
        traffic, none_failed = self.traffic_note(since)
        within = secs <= limit
        # The rule counts from the zone's last message, which came up to a heartbeat before the SIGSTOP.
        silent = stopped_at - parse_time(zones[FROZEN_ZONE]["lastSeen"])
        self.record("e", within and kept_ok and all(s == "online" for s in others.values()) and none_failed, secs,
                    f"{FROZEN_ZONE} offline at the global {secs:.1f}s after the SIGSTOP (limit zone_timeout + 1s = "
                    f"{fmt_s(limit)}" + (" - within it" if within else f" - {secs - limit:.1f}s OVER it") + "; "
                    f"its last message had come {silent:.1f}s before the SIGSTOP, {silent + secs:.1f}s of silence in "
                    f"all for zone_timeout {fmt_s(ZONE_TIMEOUT)}); its dataplanes "
                    + ", ".join(f"{app.split('/')[1]} (zone state {z}, {'ready' if r else 'not ready'})"
                                for app, (z, r) in kept.items())
                    + (" still listed with their last readiness" if kept_ok else " NOT kept as they were")
                    + "; " + ", ".join(f"{z} {s}" for z, s in others.items())
                    + f"; the front holds {FROZEN_ZONE}'s endpoints degraded {degraded:.1f}s after; {traffic}")

    def step_f(self):
        proc = self.hdsds[FROZEN_ZONE]
        frozen = self.in_zone(FROZEN_ZONE)
        step_line(f"(f) waking {FROZEN_ZONE}'s hdsd (SIGCONT): it notices the silence, dials the global again, and "
                  f"{FROZEN_ZONE} is online again with its inbounds ready; the front's {FROZEN_ZONE} endpoints turn healthy")
        since = self.client.counts()
        before = self.zones()[FROZEN_ZONE]
        proc.signal_group(signal.SIGCONT)
        t0 = time.monotonic()
        wait_until(self.sup, f"{FROZEN_ZONE} online again at the global, on a new stream", 20,
                   lambda: (lambda z: (z["state"] == "online" and z["streams"] > before["streams"],
                                       {k: z[k] for k in ("state", "streams")}))(self.zones()[FROZEN_ZONE]))
        secs = time.monotonic() - t0

        def ready():
            items = self.zone_items()
            got = {b.app: self.at_global(items, b) for b in frozen}
            return all(g == ("online", True) for g in got.values()), got
        wait_until(self.sup, f"{FROZEN_ZONE}'s dataplanes online and ready at the global", 10, ready)
        wait_until(self.sup, f"the front Envoy to hold {FROZEN_ZONE}'s endpoints healthy again", 10,
                   self.front_flags(frozen, lambda f: f == "healthy"))
        healthy = time.monotonic() - t0
        after = self.zones()[FROZEN_ZONE]
        traffic, none_failed = self.traffic_note(since)
        resumed = after["resumes"] > before["resumes"] and after["snapshots"] == before["snapshots"]
        self.record("f", none_failed, secs,
                    f"{FROZEN_ZONE} online again {secs:.1f}s after the SIGCONT (stream {after['streams']}, "
                    + ("resumed without a snapshot" if resumed else
                       f"resumes {before['resumes']}->{after['resumes']}, snapshots {before['snapshots']}->{after['snapshots']}")
                    + f"), its inbounds ready there; the front holds its endpoints healthy {healthy:.1f}s after; {traffic}")

    # -- modes

    def where_to_look(self):
        say("Where to look (in another terminal) while the story runs:")
        say(f"  {self.page_url()}   (the global's page: every zone's dataplanes)")
        for zone in ZONES:
            say(f"  {self.api[zone]}/ui/   (zone {zone}'s own page)")
        say(f"  curl -s {self.global_api}/api/v1/zones")
        say(f"  curl -s {self.global_api}/api/v1/dataplanes   (each zone's items carry zone: {{name, state}})")
        say(f"  curl -s {self.front_url}   (the front Envoy in {FRONT_ZONE}: says which zone's app answered)")
        say(f"  logs: {WORK}/logs/ (hdsd-global.log, hdsd-eu-1.log, hdsd-us-1.log, envoy-*.log, app-*.log)")

    def run(self):
        say(f"Global's page: {self.page_url()} (open it in a browser: it lists both zones' dataplanes as the story runs)")
        say(f"hdsd zones demo: a global hdsd; zones {FRONT_ZONE} ({len(self.in_zone(FRONT_ZONE))} web apps) and "
            f"{OTHER_ZONE} ({len(self.in_zone(OTHER_ZONE))}), each its own hdsd with a sidecar Envoy per app; a front "
            f"Envoy in {FRONT_ZONE} on {self.front_url} fed by the global's EDS; work dir {WORK}/")
        self.preflight()
        if not self.once:
            self.where_to_look()
        step_line(f"setting up: the global's signing key, zone tokens, configs and bootstraps; the global, "
                  f"{len(ZONES)} zone hdsds and {len(self.backends)} apps")
        self.prepare()
        for node in ("global",) + ZONES:
            self.start_hdsd(node)
        status, body = http_get(self.page_url())
        if status != 200 or "<title>hdsd fleet</title>" not in body:
            raise DemoError(f"GET {self.page_url()} answered {status}, not the fleet page")
        for b in self.backends:
            self.start_app(b)
        say("    apps: " + ", ".join(f"{b.app} 127.0.0.1:{b.app_port} (inbound {b.inbound})" for b in self.backends))
        self.run_steps()
        answers, failures, _ = self.client.counts()
        self.client.stop()
        say(f"    the client stopped: {sum(answers.values()) + failures} requests through the front Envoy, "
            f"{failures} failed; by zone: " + ", ".join(f"{z} {n}" for z, n in sorted(by_zone(answers).items())))
        say(f"    the global's page: {self.page_url()} (both zones' dataplanes; zones: {self.global_api}/api/v1/zones)")
        if self.once:
            return
        pid = self.hdsds[FROZEN_ZONE].pid
        step_line(f"the story is over: the zones as the global sees them follow, a line per change, until Ctrl-C. In "
                  f"another terminal, `kill -STOP {pid}` freezes {FROZEN_ZONE}'s hdsd (`kill -CONT {pid}` wakes it): "
                  f"watch it turn offline here")
        last = None
        while True:
            self.sup.check_running()
            try:
                line = "; ".join(f"{name} {z['state']} ({z['inbounds']['ready']}/{z['inbounds']['total']} inbounds ready)"
                                 for name, z in self.zones().items())
            except (OSError, ValueError, KeyError) as e:
                line = f"the global does not answer: {e}"
            if line != last:
                say(f"    {time.strftime('%H:%M:%S')}  {line}")
                last = line
            time.sleep(0.5)  # a display refresh, not a wait for anything


class _Adopted(Proc):
    """A Popen started elsewhere (for its terminal output), stopped like the others."""

    def __init__(self, name, popen):  # noqa: super().__init__ deliberately not called
        self.name, self.popen, self.pid, self.pgid = name, popen, popen.pid, popen.pid
        self.log = "(terminal)"
        self.expected_running = False


def find_envoy():
    env = os.environ.get("ENVOY_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise DemoError(f"ENVOY_BIN={env} is not an executable file")
        return env
    try:
        out = subprocess.run(["./scripts/setup.sh"], cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise DemoError(f"./scripts/setup.sh failed ({e}); it installs Envoy: run it and read its errors") from None
    lines = out.strip().splitlines()
    if not lines or not os.access(lines[-1], os.X_OK):
        raise DemoError(f"./scripts/setup.sh did not print an Envoy binary path on its last line: {out!r}")
    return lines[-1]


def ports(count):
    def parse(text):
        try:
            values = [int(p) for p in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ports") from None
        if len(values) != count or not all(0 < p < 65536 for p in values):
            raise argparse.ArgumentTypeError(f"{text!r}: give exactly {count} ports in 1-65535")
        return values
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Ports are on 127.0.0.1; each must be free.")
    p.add_argument("--once", action="store_true", help="run the story non-interactively: PASS/FAIL per step, exit 1 on a failure")
    p.add_argument("--step-pause", type=float, default=5.0,
                   help="interactive only: seconds between steps, to watch each on the page (default 5; --once: none)")
    p.add_argument("--hdsd", default=str(DEFAULT_HDSD), help=f"hdsd binary, relative to the repository (default {DEFAULT_HDSD})")
    p.add_argument("--hds-port", type=int, default=15678, help="hdsd's HDS port (default 15678)")
    p.add_argument("--api-port", type=int, default=15680, help="hdsd's REST API port (default 15680)")
    p.add_argument("--app-ports", type=ports(3), default=list(EXAMPLE_APP_PORTS),
                   help="web,backend-api,backend-admin app ports (default 18081,18082,18083)")
    p.add_argument("--web2-port", type=int, default=18084, help="the second web app's port (web-02's servicePort, default 18084)")
    p.add_argument("--front-port", type=int, default=18080,
                   help="the front Envoy's HTTP listener (default 18080): curl it while the demo runs")
    p.add_argument("--admin-ports", type=ports(5), default=[19901, 19902, 19903, 19904, 19905],
                   help="Envoy admin ports of web-01,backend-01,the intruder,web-02,the front "
                        "(default 19901,19902,19903,19904,19905)")
    p.add_argument("--zones", action="store_true",
                   help="the multi-zone story instead: a global hdsd, zones eu-1 and us-1 (each its own hdsd, "
                        "sidecar Envoys and apps) and a front Envoy in eu-1 fed by the global's EDS")
    p.add_argument("--zones-port-base", type=int, default=ZONES_PORT_BASE,
                   help=f"with --zones: the first of the {len(zones_ports(0))} consecutive ports the zones story uses "
                        f"(default {ZONES_PORT_BASE})")
    p.add_argument("--print-init-args", action="store_true",
                   help="print the docker/hdsd-init.sh command line the demo runs, as JSON, and exit (used by tests/compose.rs)")
    args = p.parse_args(argv)
    count = len(zones_ports(0))
    if not 0 < args.zones_port_base <= 65536 - count:
        p.error(f"--zones-port-base {args.zones_port_base}: the story takes {count} ports from there, all in 1-65535")
    return args


def main(argv):
    args = parse_args(argv)
    if args.print_init_args:
        demo = Demo(args)
        print(json.dumps({"cwd": ".", "env": {k: v for k, v in demo.sup.env.items() if k.startswith("HDSD_")},
                          "argv": demo.init_argv()}))
        return 0

    def interrupt(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)

    demo = None
    code = 1
    started = time.monotonic()
    terminal = None if args.once else take_terminal()
    try:
        demo = ZonesDemo(args) if args.zones else Demo(args)
        demo.run()
        code = 0
    except DemoError as e:
        say(f"\nFAILED: {e}")
        if demo is not None and demo.sup.procs:
            for what, log in demo.failure_logs():
                say(f"{what} (last lines, {log}):\n{tail(log)}")
    except (KeyboardInterrupt, Interrupted) as e:
        say(f"\ninterrupted ({str(e) or 'SIGINT'}): stopping everything")
        # Ctrl-C is how an interactive demo ends; a story run --once that is
        # cut short did not pass.
        code = 130 if args.once else 0
    except BaseException:
        say("\nunexpected error: stopping everything")
        raise
    finally:
        # No second Ctrl-C may cut the cleanup short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if demo is not None:
            if demo.client:
                demo.client.stop()
            left = demo.sup.stop_all()
            if left:
                say("STILL RUNNING after SIGTERM and SIGKILL: "
                    + ", ".join(f"{p.name} (pid {p.pid})" for p in left))
                code = code or 1
            else:
                say(f"stopped all {len(demo.sup.procs)} processes the demo started; none is left running")
            if args.once and demo.results:
                summarize(demo, code, time.monotonic() - started)
        give_back_terminal(terminal)
    return code


def take_terminal():
    """Interactive on a terminal: the demo becomes the terminal's foreground
    process group, as a shell makes a job, so that Ctrl-C reaches the demo
    alone and not `make` above it (which would report an interrupt and exit
    with an error). Returns what give_back_terminal needs, or None."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        return None
    try:
        before = os.tcgetpgrp(fd)
        if before != os.getpgrp():
            return (fd, None)  # not in the foreground: leave the terminal alone
        os.setpgid(0, 0)
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(fd, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
        return (fd, before)
    except OSError:
        return (fd, None)


def give_back_terminal(terminal):
    if terminal is None:
        return
    fd, before = terminal
    try:
        if before is not None:
            previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            os.tcsetpgrp(fd, before)
            signal.signal(signal.SIGTTOU, previous)
    except OSError:
        pass
    finally:
        os.close(fd)


def summarize(demo, code, total):
    say("\nstep  result  seconds  what happened")
    done = {r[0]: r for r in demo.results}
    for step in demo.STEPS:
        if step in done:
            _, passed, secs, note = done[step]
            shown = "     -" if secs is None else f"{secs:6.1f}"
            say(f"({step})   {'PASS' if passed else 'FAIL'}    {shown}   {note}")
        else:
            say(f"({step})   ----         -   not run")
    passed = sum(1 for r in demo.results if r[1])
    steps = len(demo.STEPS)
    verdict = "PASS" if code == 0 and passed == steps else "FAIL"
    say(f"{demo.NAME}: {verdict}, {passed} of {steps} steps as said, {total:.1f}s in all; logs in {WORK}/logs/")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
