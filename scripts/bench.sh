#!/usr/bin/env bash
# Load scenarios of BENCHMARKS.md: a release hdsd (auth.mode = "none",
# hds.report_interval = 5s, state and dataplanes in a temp dir) against
# hdsd-loadgen on this machine, plus the criterion micro-benchmarks.
#
#   scripts/bench.sh                  # every scenario
#   scripts/bench.sh steady10k storm10k   # some of them
#
# Scenarios: steady10k steady50k saturation storm10k churn watchers10k eds10k zones10x10k detection
# micro, and (only when named) report_instructions: instructions per report of hdsd and
# of the null server under callgrind (REPORT_INSTRUCTIONS_DATAPLANES, default 200, reports
# every 1 s; REPORT_INSTRUCTIONS_SECONDS, default 20); detection_zones: a global and two zones, app stops in
# us-1 timed at a front Envoy in eu-1 (scripts/detection_zones.py, about 10 minutes);
# soak10k: 10k dataplanes for DURATION_SOAK (default 2h), hdsd's RSS sampled every 10 s,
# growth over the last hour in soak10k.json (rss_soak);
# api100k: the fleet API at API_DATAPLANES (default 100000) dataplanes, a tenth connected
# (scripts/bench_api.py: list pages, filters, summary, services, watches, the page in
# Chromium; DURATION_API bounds the simulated Envoys, default 900s);
# cluster10k: three instances on a throwaway PostgreSQL, a third of 10k dataplanes
# each, then one instance killed (scripts/bench_cluster.py; DURATION_CLUSTER, default 60,
# in seconds; CLUSTER_DATAPLANES, default 10000);
# cluster100k: CLUSTER100K_INSTANCES (default 8) instances on one throwaway PostgreSQL,
# CLUSTER100K_DATAPLANES (100000) dataplanes, one HDS connection each, one loadgen per
# instance listing every instance (its own first) over 64 loopback source addresses:
# memory per dataplane held and not held, report at a -> visible at e (p50/p99,
# LATENCY_CLUSTER seconds of flips, default 30), a steady window of DURATION_CLUSTER
# (60 s; CPU, RSS and write transactions/s of every instance, PostgreSQL's CPU and
# memory), then SIGKILL of the last instance, its Envoys failing over by themselves
# (not-ready inbounds on the survivors every 200 ms, CPU per reconnect). Needs root
# (PostgreSQL runs as the postgres user) and 20,000 descriptors per process; at 100k also
# more cores and memory than a 2-core, 24 GB machine has (BENCHMARKS.md), where it stops at
# CLUSTER100K_TIMEOUT (3600 s) at the latest;
# zones10x10k: one global (auth.mode = "token", API port + 1 its zone listener), ZONES zones
# (default 10) of ZONE_DATAPLANES dataplanes each (10000), ZONE_FLIPS readiness flips/s per
# zone (50): one real zone hdsd with simulated Envoys from `hdsd-loadgen run` (REAL_ZONE=0:
# none; it takes the next two ports) and `hdsd-loadgen zones` for the others. DURATION_ZONES
# (60, in seconds) of steady flips, then one zone away for ZONE_OUTAGE (30, in seconds) and
# its resume against a snapshot, then a reconnect storm of every simulated zone. In
# zones10x10k.json: the global's CPU (% of a core) and RSS (per remote dataplane), change ->
# visible at a global watcher (p50/p99), resume vs snapshot bytes and times, the storm's
# time against the zones' first backoff + 2 s.
# Results: one JSON file per scenario in $OUT (default target/bench-results).
# Knobs: BENCH_PORT_BASE (default 25678: HDS, null server, API), DURATION_10K (default 300s),
#        DURATION_50K (120s), SATURATION_DURATION (30s), SATURATION_RUNS (5, alternating),
#        SATURATION_DATAPLANES (1000), STREAMS_PER_CONNECTION_50K (4: see BENCHMARKS.md),
#        DURATION_CONSUMERS (60s: the window without, then with the consumers),
#        WATCHERS (100), EDS_SUBSCRIBERS (50), FLIP_FRACTION (0.025: 50 flips/s at 10k, 5 s),
#        DETECTION_CYCLES (100, detection and detection_zones), SPREAD_REPORTS (eds10k:
#        set to spread the simulated Envoys' report timers over one interval instead of
#        the bursts of Envoys that all connected at once), BENCH_SERVER_ENV (VAR=value words put in
#        hdsd's environment, e.g. LD_PRELOAD=<an allocator's .so> to compare
#        allocators; not HDSD_*, which the config reads).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET/bench-results}
BIN=$TARGET/release
# BENCH_PORT_BASE moves the three ports (e.g. to run the soak beside other scenarios).
PORT_BASE=${BENCH_PORT_BASE:-25678}
HDS=127.0.0.1:$PORT_BASE
API=127.0.0.1:$((PORT_BASE + 2))
NULL=127.0.0.1:$((PORT_BASE + 1))
mkdir -p "$OUT"

scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  scenarios=(steady10k steady50k saturation storm10k churn watchers10k eds10k zones10x10k detection micro)
fi

if pgrep -f 'cargo test' >/dev/null; then
  echo "bench: warning: a cargo test is running; timings will be off" >&2
fi

# NO_BUILD=1: use the release binaries already in $TARGET/release.
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release --bins >&2
fi

{
  echo "nproc: $(nproc)"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "kernel: $(uname -r)"
  echo "RLIMIT_NOFILE (soft/hard): $(ulimit -Sn)/$(ulimit -Hn)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$OUT/machine.txt" >&2

WORK=$(mktemp -d)
HDSD_PID=""
NULL_PID=""
cleanup() {
  [ -n "$HDSD_PID" ] && kill "$HDSD_PID" 2>/dev/null || true
  [ -n "$NULL_PID" ] && kill "$NULL_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# gen DIR COUNT [ARGS...]: COUNT dataplanes x 2 inbounds, 100 per file.
gen() {
  local dir=$1 count=$2
  shift 2
  rm -rf "$dir"
  "$BIN/hdsd-loadgen" gen-dataplanes --count "$count" --inbounds 2 --per-file "${PER_FILE:-100}" --dir "$dir" "$@" >&2
}

# start_hdsd DIR: hdsd serving DIR/dataplanes, state in DIR/state; sets HDSD_PID.
start_hdsd() {
  local dir=$1
  cat >"$dir/hdsd.toml" <<EOF
state_dir = "$dir/state"
[hds]
listen = "$HDS"
report_interval = "${BENCH_REPORT_INTERVAL:-5s}"
[api]
listen = "$API"
[dataplanes]
dir = "$dir/dataplanes"
[hds.limits]
# The simulated fleet connects from a few loopback addresses.
max_connections = 100000
max_connections_per_ip = 100000
[auth]
mode = "${BENCH_AUTH:-none}"
${BENCH_EXTRA:-}
EOF
  # BENCH_PIN (taskset) and BENCH_WRAP (valgrind) go before the binary.
  env ${BENCH_SERVER_ENV:-} ${BENCH_PIN:-} ${BENCH_WRAP:-} "$BIN/hdsd" serve --config "$dir/hdsd.toml" >"$dir/hdsd.log" 2>&1 &
  HDSD_PID=$!
  for _ in $(seq 1 "${BENCH_READY_TRIES:-600}"); do
    if curl -sf "http://$API/readyz" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$HDSD_PID" 2>/dev/null || { cat "$dir/hdsd.log" >&2; return 1; }
    sleep 0.2
  done
  echo "bench: hdsd did not become ready" >&2
  return 1
}

# wait_port ADDR [TRIES]: until something listens on ADDR (every 0.2 s).
wait_port() {
  local host=${1%:*} port=${1##*:}
  for _ in $(seq 1 "${2:-100}"); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "bench: nothing listens on $1" >&2
  return 1
}

stop_hdsd() {
  kill "$HDSD_PID" 2>/dev/null || true
  wait "$HDSD_PID" 2>/dev/null || true
  HDSD_PID=""
}

# loadgen NAME ARGS...: runs `hdsd-loadgen run` against hdsd, JSON to $OUT/NAME.json.
loadgen() {
  local name=$1
  shift
  echo "bench: $name: hdsd-loadgen run $*" >&2
  "$BIN/hdsd-loadgen" run --hds "$HDS" --api "http://$API" --server-pid "$HDSD_PID" \
    --label "$name" --json "$@" >"$OUT/$name.json" || echo "bench: $name: loadgen exited with $?" >&2
}

for s in "${scenarios[@]}"; do
  case "$s" in
  steady10k)
    d=$WORK/steady10k && mkdir -p "$d" && gen "$d/dataplanes" 10000
    start_hdsd "$d"
    loadgen steady10k --dataplanes-dir "$d/dataplanes" --duration "${DURATION_10K:-300s}"
    stop_hdsd
    ;;
  steady50k)
    d=$WORK/steady50k && mkdir -p "$d" && gen "$d/dataplanes" 50000
    start_hdsd "$d"
    loadgen steady50k --dataplanes-dir "$d/dataplanes" --duration "${DURATION_50K:-120s}" \
      --streams-per-connection "${STREAMS_PER_CONNECTION_50K:-4}" --source-ips 64
    stop_hdsd
    ;;
  saturation)
    # CPU per report of hdsd against the null server, on the same dataplanes:
    # SATURATION_RUNS (default 5) runs of each, alternating which goes first,
    # the server pinned to one core and the loadgen to the other when the
    # machine has two (taskset), so that they do not fight for one core.
    n=${SATURATION_DATAPLANES:-1000}
    d=$WORK/saturation && mkdir -p "$d" && gen "$d/dataplanes" "$n"
    runs=${SATURATION_RUNS:-5}
    server_cpu="" loadgen_cpu=""
    if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
      server_cpu="taskset -c 1" loadgen_cpu="taskset -c 0"
    fi
    saturation_null() {
      $server_cpu "$BIN/hdsd-loadgen" null-server --listen "$NULL" --report-interval 5s --clusters 2 \
        --stats-every 0s >/dev/null &
      NULL_PID=$!
      wait_port "$NULL"
      echo "bench: saturation-null-$1" >&2
      $loadgen_cpu "$BIN/hdsd-loadgen" run --hds "$NULL" --server-pid "$NULL_PID" \
        --dataplanes-dir "$d/dataplanes" --rate-unlimited --warmup 5s \
        --duration "${SATURATION_DURATION:-30s}" --label "saturation-null-$1" --json \
        >"$OUT/saturation-null-$1.json" || true
      kill "$NULL_PID" && wait "$NULL_PID" 2>/dev/null || true
      NULL_PID=""
    }
    saturation_hdsd() {
      BENCH_PIN="$server_cpu" start_hdsd "$d"
      echo "bench: saturation-hdsd-$1" >&2
      $loadgen_cpu "$BIN/hdsd-loadgen" run --hds "$HDS" --server-pid "$HDSD_PID" \
        --dataplanes-dir "$d/dataplanes" --rate-unlimited --warmup 5s \
        --duration "${SATURATION_DURATION:-30s}" --label "saturation-hdsd-$1" --json \
        >"$OUT/saturation-hdsd-$1.json" || true
      stop_hdsd
    }
    for i in $(seq 1 "$runs"); do
      if [ $((i % 2)) -eq 1 ]; then
        saturation_null "$i"; saturation_hdsd "$i"
      else
        saturation_hdsd "$i"; saturation_null "$i"
      fi
    done
    python3 - "$OUT" "$runs" "${server_cpu:-unpinned}" <<'EOF'
import json, statistics, sys
out, runs, pinned = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(1, runs + 1):
    null = json.load(open(f"{out}/saturation-null-{i}.json"))
    hdsd = json.load(open(f"{out}/saturation-hdsd-{i}.json"))
    # CPU per report, each server's own (/proc), reports counted by the loadgen.
    n, h = null["server"]["cpu_us_per_report"], hdsd["server"]["cpu_us_per_report"]
    rows.append({"run": i, "first": "null" if i % 2 else "hdsd",
                 "null_reports_per_s": null["reports_per_s"], "hdsd_reports_per_s": hdsd["reports_per_s"],
                 "null_cpu_us_per_report": n, "hdsd_cpu_us_per_report": h,
                 "cpu_per_report_ratio_hdsd_over_null": round(h / n, 3)})
ratios = [r["cpu_per_report_ratio_hdsd_over_null"] for r in rows]
summary = {"pinned": pinned, "runs": rows,
           "ratio_median": round(statistics.median(ratios), 3),
           "ratio_min": min(ratios), "ratio_max": max(ratios),
           "hdsd_cpu_us_per_report_median": round(statistics.median(r["hdsd_cpu_us_per_report"] for r in rows), 2),
           "null_cpu_us_per_report_median": round(statistics.median(r["null_cpu_us_per_report"] for r in rows), 2)}
json.dump(summary, open(f"{out}/saturation.json", "w"), indent=1)
print(f"bench: saturation: CPU per report, hdsd over null: median {summary['ratio_median']} "
      f"(min {summary['ratio_min']}, max {summary['ratio_max']}, {runs} runs, {pinned})", file=sys.stderr)
EOF
    ;;
  report_instructions)
    # Instructions per report of each server, counted by callgrind over a
    # window of steady reports (REPORT_INSTRUCTIONS_SECONDS, default 20),
    # the same dataplanes at the same rate: a ratio that the machine's load
    # cannot move. Each server runs under valgrind; the loadgen does not.
    n=${REPORT_INSTRUCTIONS_DATAPLANES:-200}
    window=${REPORT_INSTRUCTIONS_SECONDS:-20}
    d=$WORK/report_instructions && mkdir -p "$d" && gen "$d/dataplanes" "$n"
    callgrind="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$d/callgrind.%p"
    for server in null hdsd; do
      if [ "$server" = null ]; then
        $callgrind "$BIN/hdsd-loadgen" null-server --listen "$NULL" --report-interval 1s --clusters 2 \
          --stats-every 0s >"$d/null.log" 2>&1 &
        NULL_PID=$! pid=$! addr=$NULL
        wait_port "$NULL" 600
      else
        BENCH_WRAP="$callgrind" BENCH_REPORT_INTERVAL=1s BENCH_READY_TRIES=3000 start_hdsd "$d"
        pid=$HDSD_PID addr=$HDS
      fi
      echo "bench: report-instructions-$server" >&2
      # The loadgen turns counting on and off around its steady window.
      "$BIN/hdsd-loadgen" run --hds "$addr" --dataplanes-dir "$d/dataplanes" --warmup 5s \
        --duration "${window}s" --instrument-pid "$pid" --connect-timeout 600s \
        --label "report-instructions-$server" --json >"$OUT/report-instructions-$server.json" || true
      callgrind_control -d "$pid" >/dev/null
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      NULL_PID="" HDSD_PID=""
      # Every dump of the process (counting was on in the window alone).
      cat "$d"/callgrind."$pid"* | awk '/^totals:/ {s += $2} END {print s + 0}' >"$d/$server.instructions"
      # Kept for callgrind_annotate (where the instructions go).
      for f in "$d"/callgrind."$pid"*; do
        cp "$f" "$OUT/report-instructions-$server.${f##*/}"
      done
    done
    python3 - "$OUT" "$d" <<'EOF'
import json, sys
out, d = sys.argv[1], sys.argv[2]
summary = {}
for server in ("null", "hdsd"):
    run = json.load(open(f"{out}/report-instructions-{server}.json"))
    instructions = int(open(f"{d}/{server}.instructions").read().split()[0])
    if instructions == 0:
        sys.exit(f"bench: report_instructions: callgrind counted nothing in the {server} server: "
                 "is valgrind's callgrind_control on the PATH?")
    summary[server] = {"instructions": instructions, "reports": run["reports_sent"],
                       "instructions_per_report": round(instructions / run["reports_sent"])}
summary["ratio_hdsd_over_null"] = round(
    summary["hdsd"]["instructions_per_report"] / summary["null"]["instructions_per_report"], 3)
json.dump(summary, open(f"{out}/report_instructions.json", "w"), indent=1)
print(f"bench: report_instructions: {summary}", file=sys.stderr)
EOF
    ;;
  api100k)
    # The fleet API at API_DATAPLANES (default 100,000) dataplanes, a tenth of
    # them connected by simulated Envoys (reports every 5 s, 2.5 % flipping):
    # pages, filters, the summary, services, watches and the page in
    # Chromium, timed by scripts/bench_api.py.
    n=${API_DATAPLANES:-100000}
    connected=$((n / 10))
    d=$WORK/api100k && mkdir -p "$d" && gen "$d/dataplanes" "$n" --services $((n / 100))
    start_hdsd "$d"
    "$BIN/hdsd-loadgen" run --hds "$HDS" --count "$connected" --prefix dp- --source-ips 8 \
      --connect-timeout 300s --duration "${DURATION_API:-900s}" --flip-fraction 0.025 \
      >"$d/loadgen.out" 2>&1 &
    loadgen_pid=$!
    py=python3
    [ -x .venv/bin/python ] && py=.venv/bin/python
    chromium=$(command -v chromium || command -v chromium-browser || true)
    timeout 1200 "$py" scripts/bench_api.py --api "http://$API" --pid "$HDSD_PID" \
      --dataplanes "$n" --connected "$connected" ${chromium:+--chromium "$chromium"} \
      --json "$OUT/api100k.json" || { kill "$loadgen_pid" 2>/dev/null; stop_hdsd; exit 1; }
    kill "$loadgen_pid" 2>/dev/null || true
    wait "$loadgen_pid" 2>/dev/null || true
    stop_hdsd
    ;;
  storm10k)
    d=$WORK/storm10k && mkdir -p "$d" && gen "$d/dataplanes" 10000
    start_hdsd "$d"
    loadgen storm10k --dataplanes-dir "$d/dataplanes" --duration 10s --reconnect-storm
    stop_hdsd
    ;;
  churn)
    d=$WORK/churn && mkdir -p "$d" && gen "$d/dataplanes" 10000
    start_hdsd "$d"
    loadgen churn --dataplanes-dir "$d/dataplanes" --duration 10s --churn 20000 --churn-rate 1000
    stop_hdsd
    ;;
  watchers10k)
    # 10k dataplanes, 50 flips/s: a steady window without watchers, then
    # WATCHERS gRPC Watch clients for another window with the same flips.
    d=$WORK/watchers10k && mkdir -p "$d" && gen "$d/dataplanes" 10000
    start_hdsd "$d"
    loadgen watchers10k --dataplanes-dir "$d/dataplanes" --duration "${DURATION_CONSUMERS:-60s}" \
      --flip-fraction "${FLIP_FRACTION:-0.025}" --sample 0 --watchers "${WATCHERS:-100}"
    stop_hdsd
    ;;
  eds10k)
    # 10k dataplanes in 500 services, 50 flips/s: a steady window without EDS
    # subscribers, then EDS_SUBSCRIBERS front Envoys subscribed to every service.
    d=$WORK/eds10k && mkdir -p "$d" && gen "$d/dataplanes" 10000 --services 500
    start_hdsd "$d"
    loadgen eds10k --dataplanes-dir "$d/dataplanes" --duration "${DURATION_CONSUMERS:-60s}" \
      --flip-fraction "${FLIP_FRACTION:-0.025}" --sample 0 --eds-subscribers "${EDS_SUBSCRIBERS:-50}" \
      ${SPREAD_REPORTS:+--spread-reports}
    stop_hdsd
    ;;
  soak10k)
    d=$WORK/soak10k && mkdir -p "$d" && gen "$d/dataplanes" 10000
    start_hdsd "$d"
    loadgen soak10k --dataplanes-dir "$d/dataplanes" --duration "${DURATION_SOAK:-2h}" --rss-sample-every 10s
    stop_hdsd
    ;;
  zones10x10k)
    # One global (auth.mode = "token", zones auto-registered), REAL_ZONE (default 1) real zone
    # hdsd with ZONE_DATAPLANES simulated Envoys from `hdsd-loadgen run` flipping ZONE_FLIPS
    # a second, and `hdsd-loadgen zones` for the other zones (ZONES in all, ZONE_DATAPLANES
    # each, ZONE_FLIPS flips/s each): DURATION_ZONES of steady flips timed at a watcher of
    # the global, a ZONE_OUTAGE resume against a snapshot, then a reconnect storm.
    d=$WORK/zones10x10k && mkdir -p "$d/dataplanes"
    zones=${ZONES:-10} per_zone=${ZONE_DATAPLANES:-10000} zone_flips=${ZONE_FLIPS:-50}
    real=${REAL_ZONE:-1}
    [ "$zones" -gt "$real" ] || { echo "bench: zones10x10k: ZONES must exceed REAL_ZONE" >&2; exit 2; }
    zones_addr=127.0.0.1:$((PORT_BASE + 3))
    BENCH_AUTH=token BENCH_EXTRA="[global]
enabled = true
listen = \"$zones_addr\"
auto_register = true" start_hdsd "$d"
    global_pid=$HDSD_PID
    # The global's RSS with no zone yet (KiB), for the memory per remote dataplane of all zones.
    awk '/VmRSS/ {print $2}' "/proc/$global_pid/status" >"$d/global-rss-empty-kib"
    zone_pid="" zone_run_pid=""
    if [ "$real" = 1 ]; then
      z=$d/rz-01 && mkdir -p "$z" && gen "$z/dataplanes" "$per_zone"
      "$BIN/hdsd" token issue --config "$d/hdsd.toml" --zone rz-01 --mesh default >"$z/zone.token"
      cat >"$z/hdsd.toml" <<EOF
state_dir = "$z/state"
[hds]
listen = "127.0.0.1:$((PORT_BASE + 4))"
report_interval = "5s"
[api]
listen = "127.0.0.1:$((PORT_BASE + 5))"
[dataplanes]
dir = "$z/dataplanes"
[hds.limits]
max_connections = 100000
max_connections_per_ip = 100000
[auth]
mode = "none"
[zone]
name = "rz-01"
global = ["http://$zones_addr"]
token_file = "$z/zone.token"
EOF
      "$BIN/hdsd" serve --config "$z/hdsd.toml" >"$z/hdsd.log" 2>&1 &
      zone_pid=$!
      wait_port "127.0.0.1:$((PORT_BASE + 5))" 600
      # Its Envoys flip ZONE_FLIPS a second (a fraction of them at every 5 s report).
      fraction=$(python3 -c "print(min(1.0, $zone_flips * 5 / $per_zone))")
      "$BIN/hdsd-loadgen" run --hds "127.0.0.1:$((PORT_BASE + 4))" --api "http://127.0.0.1:$((PORT_BASE + 5))" \
        --server-pid "$zone_pid" --dataplanes-dir "$z/dataplanes" --flip-fraction "$fraction" --sample 0 \
        --duration "$((${DURATION_ZONES:-60} + ${ZONE_OUTAGE:-30} + 120))s" --label zones10x10k-real-zone --json \
        >"$d/real-zone-run.json" &   # stopped below, when the simulated zones are done
      zone_run_pid=$!
      # Before the simulated zones: its Envoys connected and its dataplanes at the global.
      for _ in $(seq 1 600); do
        connected=$(curl -sf "http://127.0.0.1:$((PORT_BASE + 5))/api/v1/fleet/summary" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["dataplanes"]["connected"])' 2>/dev/null || echo 0)
        held=$(curl -sf "http://$API/api/v1/zones/rz-01" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["dataplanes"])' 2>/dev/null || echo 0)
        [ "$connected" = "$per_zone" ] && [ "$held" = "$per_zone" ] && break
        sleep 0.5
      done
      echo "bench: zones10x10k: real zone rz-01: $connected Envoys connected, $held dataplanes at the global" >&2
    fi
    echo "bench: zones10x10k: hdsd-loadgen zones, $((zones - real)) simulated zones x $per_zone" >&2
    "$BIN/hdsd-loadgen" zones --global "$zones_addr" --api "http://$API" --sign-with-state-dir "$d/state" \
      --server-pid "$global_pid" --zones "$((zones - real))" --dataplanes "$per_zone" --flips-per-s "$zone_flips" \
      --duration "${DURATION_ZONES:-60}s" --outage "${ZONE_OUTAGE:-30}s" --storm --label zones10x10k --json \
      >"$d/zones.json" || echo "bench: zones10x10k: loadgen exited with $?" >&2
    # What the global holds of every zone, the real one included.
    curl -sf "http://$API/api/v1/zones" >"$d/global-zones.json" || echo '{"items": []}' >"$d/global-zones.json"
    if [ -n "$zone_run_pid" ]; then kill "$zone_run_pid" 2>/dev/null || true; wait "$zone_run_pid" 2>/dev/null || true; fi
    if [ -n "$zone_pid" ]; then kill "$zone_pid" 2>/dev/null || true; wait "$zone_pid" 2>/dev/null || true; fi
    stop_hdsd
    python3 - "$d/zones.json" "$d/global-zones.json" "$OUT/zones10x10k.json" "$zones" "$per_zone" "$real" \
      "$(cat "$d/global-rss-empty-kib")" <<'EOF'
import json, sys
zones_json, global_json, out, zones, per_zone, real, rss_empty_kib = sys.argv[1:8]
run = json.load(open(zones_json))
held = json.load(open(global_json))["items"]
run["zones_total"] = int(zones)
run["real_zones"] = int(real)
run["global_zones"] = [{k: z.get(k) for k in ("name", "state", "dataplanes", "inbounds", "streams", "resumes", "snapshots")}
                       for z in held]
total = sum(z.get("dataplanes", 0) for z in held)
run["global_dataplanes_held"] = total
server = run.get("server") or {}
if server.get("rss_steady_mib") is not None and total:
    # Over every remote dataplane the global holds, the real zone's included,
    # from the global's RSS before any zone connected.
    server["rss_empty_mib"] = round(int(rss_empty_kib) / 1024, 3)
    server["rss_per_remote_dataplane_all_zones_bytes"] = round(
        (server["rss_steady_mib"] * 1048576 - int(rss_empty_kib) * 1024) / total)
json.dump(run, open(out, "w"), indent=1)
s = run["steady"]["change_to_watcher"]["latency"]
print(f"bench: zones10x10k: global CPU {server.get('cpu_percent_steady')}% of a core, "
      f"RSS {server.get('rss_steady_mib')} MiB, change->watcher p50 {s.get('p50_ms')} ms p99 {s.get('p99_ms')} ms, "
      f"resume {json.dumps(run.get('resume'))}, storm {json.dumps(run.get('storm'))}", file=sys.stderr)
EOF
    ;;
  cluster10k)
    # Three instances on one PostgreSQL (needs Debian's postgresql and root:
    # the server runs as the postgres user); see scripts/bench_cluster.py.
    python3 scripts/bench_cluster.py --bin "$BIN" --dataplanes "${CLUSTER_DATAPLANES:-10000}" \
      --window "${DURATION_CLUSTER:-60}" --port-base $((PORT_BASE + 100)) --json "$OUT/cluster10k.json" >/dev/null
    ;;
  cluster100k)
    # Eight instances, 100k dataplanes: the first section of the cluster issue.
    # Bounded: every wait of scripts/bench_cluster.py has a deadline, and the
    # whole run a timeout.
    timeout "${CLUSTER100K_TIMEOUT:-3600}" python3 scripts/bench_cluster.py --bin "$BIN" \
      --instances "${CLUSTER100K_INSTANCES:-8}" --dataplanes "${CLUSTER100K_DATAPLANES:-100000}" \
      --window "${DURATION_CLUSTER:-60}" --latency-window "${LATENCY_CLUSTER:-30}" \
      --port-base $((PORT_BASE + 200)) --json "$OUT/cluster100k.json" >/dev/null
    ;;
  detection)
    # A real Envoy, 100 app stops and starts: times against the floor and worst case.
    ENVOY_BIN=${ENVOY_BIN:-$(./scripts/setup.sh)} python3 scripts/detection.py --hdsd "$BIN/hdsd" \
      --cycles "${DETECTION_CYCLES:-100}" --json "$OUT/detection.json" >/dev/null
    ;;
  detection_zones)
    # A global, zones us-1 and eu-1: app stops in us-1 -> push at a front in eu-1, against us-1's detection.
    ENVOY_BIN=${ENVOY_BIN:-$(./scripts/setup.sh)} python3 scripts/detection_zones.py --hdsd "$BIN/hdsd" \
      --cycles "${DETECTION_CYCLES:-100}" --json "$OUT/detection_zones.json" >/dev/null
    ;;
  micro)
    cargo bench --bench specifier --bench readiness 2>&1 | tee "$OUT/micro.txt" >&2
    ;;
  *)
    echo "bench: unknown scenario $s (steady10k steady50k saturation storm10k churn watchers10k eds10k soak10k cluster10k cluster100k api100k zones10x10k detection detection_zones micro)" >&2
    exit 2
    ;;
  esac
done
echo "bench: results in $OUT" >&2
