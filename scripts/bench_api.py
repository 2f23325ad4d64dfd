#!/usr/bin/env python3
"""The fleet API at scale (BENCHMARKS.md, "api100k"): against a running hdsd
that serves DATAPLANES dataplanes, times what a client of the fleet does.

- list: every page of GET /api/v1/dataplanes at the default page size, in
  order (the page token of each answer), and the first page of filtered
  lists (not ready, one service, one status): each request's time;
- summary: GET /api/v1/fleet/summary (the counts the page shows);
- services: GET /api/v1/services (REST's ListServices);
- watch: GET /api/v1/watch (Server-Sent Events): the time from the request
  to its `synced` event (the snapshot of the whole fleet), then WATCHERS
  watchers held open after their snapshot: hdsd's RSS added per watcher;
  then the same with the snapshot in pages (--snapshot-page, default 1000);
- browser (with --chromium): the fleet page in headless Chromium: first
  contentful paint, the time until the counts show the fleet and until the
  table is loaded, and the page's JavaScript heap.

Only the standard library, and Playwright for the browser (scripts/setup.sh
installs it in .venv). Bounded: each phase has a deadline; loopback only.

  python3 scripts/bench_api.py --api http://127.0.0.1:25680 --pid PID \\
      --dataplanes 100000 --json target/bench-results/api100k.json
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Api:
    def __init__(self, base):
        url = urllib.parse.urlsplit(base)
        self.host, self.port = url.hostname, url.port or 80
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def get(self, path):
        """(seconds, status, parsed JSON body)."""
        started = time.monotonic()
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        body = response.read()
        took = time.monotonic() - started
        return took, response.status, json.loads(body) if body else None


def figures(samples):
    """p50, p99 and max in milliseconds, and the count."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "count": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def wait_fleet(api, dataplanes, connected, deadline):
    while True:
        _, status, summary = api.get("/api/v1/fleet/summary")
        counts = summary["dataplanes"] if status == 200 else {}
        if counts.get("total", 0) >= dataplanes and counts.get("connected", 0) >= connected:
            return counts
        if time.monotonic() > deadline:
            sys.exit(f"bench_api: the fleet did not come up: {summary}")
        time.sleep(0.5)


def walk_pages(api):
    """Every page in order: (times, items seen, pages)."""
    times, items, token = [], 0, ""
    while True:
        path = "/api/v1/dataplanes" + (f"?page_token={urllib.parse.quote(token)}" if token else "")
        took, status, page = api.get(path)
        if status != 200:
            sys.exit(f"bench_api: GET {path}: {status} {page}")
        times.append(took)
        items += len(page["items"])
        token = page.get("nextPageToken") or ""
        if not token:
            return times, items


def watch_until_synced(host, port, held=None, stop=None, page=0):
    """Opens GET /api/v1/watch (its snapshot in pages of `page` items, 0:
    whole); returns the seconds until its `synced` event. With `held`, keeps
    reading (and draining) until `stop` is set."""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    started = time.monotonic()
    path = "/api/v1/watch" + (f"?snapshot_page_size={page}" if page else "")
    conn.request("GET", path, headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"GET /api/v1/watch: {response.status}")
    synced = None
    while synced is None:
        line = response.readline()
        if not line:
            raise RuntimeError("the watch ended before its snapshot was complete")
        if line.strip() == b"event: synced":
            synced = time.monotonic() - started
    if held is not None:
        held.append(synced)
        conn.sock.settimeout(1)
        while not stop.is_set():
            try:
                if not response.readline():
                    break
            except OSError:
                continue
    conn.close()
    return synced


def browser(args, dataplanes):
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=args.chromium, headless=True,
                                     args=["--enable-precise-memory-info"])
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 800})
            started = time.monotonic()
            page.goto(args.api + "/ui/")
            page.wait_for_function(
                "n => { const dd = document.querySelector('#counts [data-count=\"dataplanes\"] dd');"
                " return dd && Number(dd.textContent) >= n; }",
                arg=dataplanes, timeout=args.browser_timeout * 1000)
            out["counts_shown_s"] = round(time.monotonic() - started, 3)
            page.wait_for_function("() => document.querySelectorAll('#dataplanes tbody tr').length > 0",
                                   timeout=args.browser_timeout * 1000)
            out["table_shown_s"] = round(time.monotonic() - started, 3)
            paint = page.evaluate(
                "() => (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null")
            out["first_contentful_paint_ms"] = round(paint, 1) if paint is not None else None
            out["rows_drawn"] = page.evaluate("() => document.querySelectorAll('#dataplanes tbody tr').length")
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            out["js_heap_used_mb"] = round(metrics.get("JSHeapUsedSize", 0) / 2**20, 1)
            out["js_heap_total_mb"] = round(metrics.get("JSHeapTotalSize", 0) / 2**20, 1)
            out["dom_nodes"] = int(metrics.get("Nodes", 0))
        finally:
            chromium.close()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, help="hdsd's API, e.g. http://127.0.0.1:25680")
    parser.add_argument("--pid", type=int, required=True, help="hdsd's process id (its RSS)")
    parser.add_argument("--dataplanes", type=int, required=True)
    parser.add_argument("--connected", type=int, default=0, help="wait until this many are connected")
    parser.add_argument("--service", default="svc-0000", help="a service for the filtered list")
    parser.add_argument("--rounds", type=int, default=3, help="walks of every page")
    parser.add_argument("--watchers", type=int, default=20)
    parser.add_argument("--snapshot-page", type=int, default=1000,
                        help="snapshot_page_size of the second round of watches")
    parser.add_argument("--chromium", help="Chromium's binary: measure the fleet page")
    parser.add_argument("--browser-timeout", type=float, default=120)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    api = Api(args.api)
    result = {"dataplanes": args.dataplanes}
    summary = wait_fleet(api, args.dataplanes, args.connected, time.monotonic() + 300)
    result["fleet"] = summary
    result["rss_kb"] = rss_kb(args.pid)

    # Watches first: the reads below grow the heap, and what the allocator
    # later returns would hide what the watchers hold.
    # Each twice: the snapshot whole, then in pages of --snapshot-page.
    for suffix, page in (("", 0), ("_paged", args.snapshot_page)):
        result["watch_synced" + suffix] = figures(
            [watch_until_synced(api.host, api.port, page=page) for _ in range(5)])
        before = rss_kb(args.pid)
        held, stop = [], threading.Event()
        threads = [threading.Thread(target=watch_until_synced, args=(api.host, api.port, held, stop, page),
                                    daemon=True)
                   for _ in range(args.watchers)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 300
        while len(held) < args.watchers and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # let the last snapshots' buffers go
        with_watchers = rss_kb(args.pid)
        result["watchers" + suffix] = {
            "snapshot_page_size": page,
            "held": len(held),
            "synced": figures(held) if held else None,
            "rss_before_kb": before,
            "rss_with_kb": with_watchers,
            "kb_per_watcher": round((with_watchers - before) / max(1, len(held)), 1),
        }
        stop.set()
        for t in threads:
            t.join(timeout=5)

    pages, walks = [], []
    for _ in range(args.rounds):
        started = time.monotonic()
        times, items = walk_pages(api)
        walks.append(time.monotonic() - started)
        if items < args.dataplanes:
            sys.exit(f"bench_api: walked {items} items, expected {args.dataplanes}")
        pages += times
    result["list_page"] = figures(pages)
    result["list_walk_s"] = [round(w, 2) for w in walks]
    filtered = {}
    for name, query in (("not_ready", "ready=false"), ("service", f"service={args.service}"),
                        ("status_healthy", "status=healthy")):
        filtered[name] = figures([api.get(f"/api/v1/dataplanes?{query}")[0] for _ in range(20)])
    result["list_filtered_first_page"] = filtered
    result["summary"] = figures([api.get("/api/v1/fleet/summary")[0] for _ in range(20)])
    result["services"] = figures([api.get("/api/v1/services")[0] for _ in range(10)])
    result["rss_after_reads_kb"] = rss_kb(args.pid)

    if args.chromium:
        result["browser"] = browser(args, args.dataplanes)

    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result), file=sys.stderr)


if __name__ == "__main__":
    main()
