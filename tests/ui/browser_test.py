#!/usr/bin/env python3
"""Drives hdsd's fleet page (/ui/) in a real headless Chromium with Playwright.

Run by tests/ui_browser.rs, which starts hdsd, real Envoys and apps. When this
script needs the world to change it prints `ACTION <name>` and waits for
`DONE` on its standard input. Every assertion prints `CHECK <what>`; the last
line is `PASSED <n> checks`. Any failed check exits non-zero with the reason.

    browser_test.py --url http://127.0.0.1:PORT/ui/[,URL...] --scenario live|token|soak|fleet|zones|tls|timeline|large
                    [--chromium /usr/bin/chromium] [--screenshot out.png]
                    [--detection SECONDS] [--token T]
"""

import argparse
import re
import sys
import time

from playwright.sync_api import expect, sync_playwright

BAD = "rgb(164, 14, 38)"  # --bad in app.css: the colour of "not ready"
OK = "rgb(17, 99, 41)"  # --ok


class Checks:
    def __init__(self):
        self.count = 0

    def ok(self, what):
        self.count += 1
        print(f"CHECK {what}", flush=True)

    def that(self, condition, what):
        if not condition:
            raise AssertionError(what)
        self.ok(what)


def action(name):
    """Asks the Rust side to change the world; returns when it is done, with
    what the Rust side told about it (the words after DONE)."""
    print(f"ACTION {name}", flush=True)
    reply = sys.stdin.readline().strip()
    if reply != "DONE" and not reply.startswith("DONE "):
        raise AssertionError(f"ACTION {name}: the test answered {reply!r}")
    return reply[len("DONE "):].split()


class Console:
    """Console errors and uncaught exceptions, by phase. Some phases expect
    network errors (hdsd restarting, a refused token): only those are allowed there."""

    def __init__(self, page):
        self.phase = "start"
        self.errors = []
        page.on("console", lambda m: m.type == "error" and self.errors.append((self.phase, m.text)))
        page.on("pageerror", lambda e: self.errors.append((self.phase, f"uncaught: {e}")))
        # Failed API answers count too (the browser may not log them).
        page.on("response", lambda r: r.status >= 400 and self.errors.append((self.phase, f"HTTP {r.status} {r.url}")))

    def unexpected(self, allowed):
        return [(p, t) for p, t in self.errors if not (p in allowed and allowed[p].search(t))]


def heap(page):
    """The page's used JS heap after a full garbage collection, in bytes."""
    page.evaluate("window.gc && window.gc()")
    return page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : -1")


def row(page, name):
    return page.locator(f'#dataplanes tbody tr[data-key="default/{name}"]')


def count_tile(page, name):
    return page.locator(f'#counts [data-count="{name}"] dd')


def expect_counts(page, dataplanes, connected, ready, not_ready, timeout=10_000):
    for tile, value in [("dataplanes", dataplanes), ("connected", connected), ("ready", ready), ("not-ready", not_ready)]:
        expect(count_tile(page, tile)).to_have_text(str(value), timeout=timeout)


def live(page, args, checks):
    console = Console(page)
    names = ["api-1", "web-1", "web-2"]
    # The list is held back once: until its first data the table says
    # Loading..., never an empty table or "No dataplanes".
    held = []
    page.route(re.compile(r".*/api/v1/dataplanes(\?.*)?$"), lambda route: held.append(route))
    with page.expect_request(re.compile(r".*/api/v1/dataplanes(\?.*)?$"), timeout=15_000):
        page.goto(args.url)
    expect(page.locator("#empty")).to_have_text("Loading...", timeout=15_000)
    checks.that(len(held) == 1 and page.locator("#dataplanes tbody tr").count() == 0,
                "until the list arrives the table is empty and says Loading...")
    held[0].continue_()
    page.unroute(re.compile(r".*/api/v1/dataplanes(\?.*)?$"))
    expect(page.locator("#empty")).to_be_hidden(timeout=10_000)
    checks.ok("the page says Loading... until its first data")
    page.evaluate("window.__noReload = true")
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    checks.ok("the page connects to the watch and says Live")
    heap_start = heap(page)
    expect(page.locator("#dataplanes tbody tr")).to_have_count(3, timeout=10_000)
    for name in names:
        expect(row(page, name)).to_contain_text(f"default.{name}")
        expect(row(page, name).locator(".ready-cell")).to_have_text(re.compile("Ready"))
    checks.ok("every dataplane has a row, each Ready")
    expect_counts(page, 3, 3, 3, 0)
    checks.ok("counts: 3 dataplanes, 3 connected, 3 inbounds ready, 0 not ready")
    expect(page.locator('#services [data-service="web"]')).to_contain_text("2/2 ready")
    expect(page.locator('#services [data-service="web"]')).to_contain_text("Online")
    expect(page.locator('#services [data-service="api"]')).to_contain_text("Online")
    checks.ok("services: web 2/2 Online, api Online")

    # Accessibility basics.
    checks.that(page.locator("#counts").get_attribute("aria-live") == "polite", "the counts are an aria-live region")
    checks.that(page.locator("#dataplanes thead th[scope=col]:visible").count() == 8, "the table has 8 visible column headers (the zone column only on a global)")
    checks.that(page.locator("#dataplanes tbody th[scope=row]").count() == 3, "each row has a row header")
    expect(page.get_by_label("Filter")).to_be_visible()
    checks.ok("the filter box has a label")

    # Filter box and "not ready only", by keyboard.
    page.get_by_label("Filter").focus()
    page.keyboard.type("api")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(1)
    expect(row(page, "api-1")).to_be_visible()
    page.keyboard.press("Control+A")
    page.keyboard.press("Backspace")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(3)
    checks.ok("typing in the filter narrows the rows; clearing it shows all")
    page.get_by_label("Not ready only").focus()
    page.keyboard.press("Space")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(0)
    expect(page.locator("#empty")).to_have_text("No dataplane matches the filter.")
    page.keyboard.press("Space")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(3)
    checks.ok("the not-ready-only toggle works from the keyboard")

    # Sorting.
    header = page.locator('th[data-sort="name"]')
    header.locator("button").click()
    expect(header).to_have_attribute("aria-sort", "descending")
    order = page.locator("#dataplanes tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    checks.that(order == [f"default/{n}" for n in reversed(names)], f"sorting by name descending: {order}")
    header.locator("button").click()
    expect(header).to_have_attribute("aria-sort", "ascending")

    # A row opens the detail, by keyboard; Escape closes it and focus returns.
    opener = row(page, "web-1").locator("button[data-open]")
    opener.focus()
    page.keyboard.press("Enter")
    dialog = page.locator("#detail")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("default.web-1")
    expect(dialog).to_contain_text("Specifier target")
    expect(dialog).to_contain_text("probe_127.0.0.1:")
    expect(dialog).to_contain_text("unhealthy after 2 in a row")
    expect(dialog).to_contain_text("pending")  # its first change: pending -> healthy
    checks.ok("Enter on a row's name opens its detail: target, probe settings, recent changes")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    checks.that(opener.evaluate("b => document.activeElement === b"), "Escape closes the detail; focus returns to the row")

    # An app stops: its row turns not ready, live, within detection + 1 s.
    console.phase = "stop"
    limit = args.detection + 1.0
    started = time.monotonic()
    action("stop_app web-1")
    web1 = row(page, "web-1")
    expect(web1).to_have_attribute("data-ready", "false", timeout=int(limit * 1000) + 50)
    took = time.monotonic() - started
    checks.that(took <= limit, f"web-1 turned not ready in {took:.2f}s (limit {limit:.2f}s)")
    print(f"MEASURE not_ready_seconds {took:.3f}", flush=True)
    expect(web1.locator(".ready-cell")).to_have_text(re.compile("Not ready"))
    badge = web1.locator(".badge").first
    expect(badge).to_have_text(re.compile("unhealthy"))
    colour = badge.evaluate("b => getComputedStyle(b).color")
    ready_colour = web1.locator(".readiness").evaluate("e => getComputedStyle(e).color")
    checks.that(colour == BAD and ready_colour == BAD, f"the status reads 'unhealthy' / 'Not ready' in red ({colour}, {ready_colour})")
    checks.that(page.evaluate("window.__noReload === true"), "no page reload")
    expect_counts(page, 3, 3, 2, 1)
    expect(page.locator('#services [data-service="web"]')).to_contain_text("Partially degraded")
    checks.ok("counts and services follow: 2 ready, 1 not ready, web partially degraded")
    page.wait_for_timeout(300)  # let the relative times settle for the picture
    if args.screenshot:
        page.screenshot(path=args.screenshot)
        checks.ok(f"screenshot at 1280x800: {args.screenshot}")
    web1.locator("button[data-open]").click()
    expect(dialog).to_contain_text("unhealthy")
    expect(dialog.locator(".changes li").first).to_contain_text("healthy")
    checks.ok("the detail lists the new status change")
    if args.screenshot:
        page.screenshot(path=args.screenshot.replace(".png", "-detail.png"))
    page.locator("#detail-close").click()
    expect(dialog).to_be_hidden()

    # A narrow screen: no horizontal scrolling, rows become cards.
    page.set_viewport_size({"width": 390, "height": 844})
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    checks.that(overflow <= 0, f"at 390px wide nothing overflows ({overflow}px)")
    if args.screenshot:
        page.screenshot(path=args.screenshot.replace(".png", "-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})

    # A broken dataplane file: the banner names file, line and message; fixing it removes it.
    console.phase = "banner"
    action("break_file web-2.yaml")
    banner = page.locator("#banner")
    expect(banner).to_be_visible(timeout=10_000)
    expect(banner).to_contain_text("web-2.yaml")
    expect(banner).to_contain_text(re.compile(r"line \d+"))
    expect(banner).to_have_attribute("role", "alert")
    checks.ok(f"a broken file shows the banner: {banner.locator('li').first.inner_text()}")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(3)
    action("fix_file web-2.yaml")
    expect(banner).to_be_hidden(timeout=10_000)
    checks.ok("fixing the file removes the banner")

    # The stream drops (hdsd restarts): "Reconnecting", then live again.
    page.evaluate("""() => {
        window.__liveSeen = new Set();
        const el = document.getElementById('live');
        new MutationObserver(() => window.__liveSeen.add(el.textContent)).observe(el, {childList: true, characterData: true, subtree: true});
    }""")
    console.phase = "restart"
    action("restart_hdsd")
    page.wait_for_function("window.__liveSeen.has('Reconnecting…')", timeout=15_000)
    expect(page.locator("#live")).to_have_text("Live", timeout=20_000)
    checks.ok("when the stream drops the page says Reconnecting, then Live again")
    expect(page.locator("#dataplanes tbody tr")).to_have_count(3)
    expect(web1).to_have_attribute("data-ready", "false", timeout=10_000)
    console.phase = "after"
    action("start_app web-1")
    expect(web1).to_have_attribute("data-ready", "true", timeout=15_000)
    expect_counts(page, 3, 3, 3, 0)
    checks.that(page.evaluate("window.__noReload === true"), "after the restart the rows follow the live state again, without a reload")

    # Reports that change nothing send no event; the page re-reads the list so
    # "last report" stays true.
    expect(row(page, "api-1").locator('td[data-label="Last report"]')).to_have_text(re.compile(r"^(just now|[0-7]s ago)$"), timeout=8_000)
    checks.ok("last report times stay current without status changes")

    heap_end = heap(page)
    print(f"MEASURE js_heap_bytes start {heap_start} end {heap_end}", flush=True)
    nodes = page.evaluate("document.getElementsByTagName('*').length")
    print(f"MEASURE dom_nodes {nodes}", flush=True)

    network = re.compile(r"Failed to load resource|net::ERR_")
    bad = console.unexpected({"restart": network})
    checks.that(not bad, f"no console errors: {bad}")


def token(page, args, checks):
    console = Console(page)
    urls = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(args.url)
    dialog = page.get_by_role("dialog", name="API token")
    expect(dialog).to_be_visible(timeout=10_000)
    checks.ok("with api.tokens the page asks for a token first")
    console.phase = "wrong"
    page.get_by_role("textbox", name="Token").fill("not-the-token")
    page.keyboard.press("Enter")
    expect(page.locator("#token-error")).to_contain_text("refused", timeout=10_000)
    expect(dialog).to_be_visible()
    checks.ok("a wrong token is refused and the page asks again")
    console.phase = "right"
    page.get_by_role("textbox", name="Token").fill(args.token)
    page.get_by_role("button", name="Use token").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    expect(page.locator("#dataplanes tbody tr")).to_have_count(1, timeout=10_000)
    expect(row(page, "web-1").locator(".ready-cell")).to_have_text(re.compile("Ready"), timeout=10_000)
    expect_counts(page, 1, 1, 1, 0)
    checks.ok("with the token the page loads, follows the watch and shows the dataplane")
    stored = page.evaluate("sessionStorage.getItem('hdsd.apiToken')")
    checks.that(stored == args.token, "the token is kept in the tab's session storage")
    page.reload()
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    checks.that(not page.locator("#token-dialog").is_visible(), "after a reload the tab does not ask again")
    leaked = [u for u in urls if args.token in u]
    checks.that(not leaked, "the token never appears in a URL")
    refused = re.compile(r"401")  # only the wrong token's answers
    bad = console.unexpected({"wrong": refused})
    checks.that(not bad, f"no console errors besides the refused token's 401: {bad}")


def fleet(page, args, checks):
    """Three instances on one PostgreSQL, a page on each: every page answers
    for the fleet ("Connected" on the holder, "Connected (on <holder>)" on
    the others), within a second of the connect and after a failover."""
    urls = args.url.split(",")
    pages = [page] + [page.context.browser.new_page(viewport={"width": 1280, "height": 800}) for _ in urls[1:]]
    for p, url in zip(pages, urls):
        p.goto(url)
        expect(p.locator("#live")).to_have_text("Live", timeout=15_000)
        expect(row(p, "web-01").locator("td").first).to_have_text(re.compile("Disconnected"), timeout=10_000)
    checks.ok("before any Envoy, every page reads web-01 Disconnected")

    def expect_held(holder, pid, alive):
        for i in alive:
            cell = row(pages[i], "web-01").locator("td").first
            if i == holder:
                expect(cell).to_have_text(re.compile(r"^\W*Connected$"), timeout=1_000)
            else:
                expect(cell).to_have_text(re.compile(rf"Connected \(on \S+/{pid}\)"), timeout=1_000)

    holder, pid = (int(x) for x in action("connect"))
    alive = list(range(len(pages)))
    expect_held(holder, pid, alive)
    checks.ok(f"within 1 s of the connect: Connected on instance {holder}, Connected (on .../{pid}) on the others")
    pages[holder].close()
    alive.remove(holder)
    old = holder
    holder, pid = (int(x) for x in action("failover"))
    checks.that(holder != old and holder in alive, f"the Envoy moved from {old} to {holder}")
    expect_held(holder, pid, alive)
    checks.ok(f"within 1 s of the failover: Connected on instance {holder}, Connected (on .../{pid}) on the other")
    for i in alive:
        pages[i].screenshot(path=f"{args.screenshot}.{i}.png") if args.screenshot else None


def zones(page, args, checks):
    """A global's page: the zones panel (state in words and colour, last
    seen), a zone column and filter; a zone frozen by the test turns
    Offline in the panel and on its rows, and back Online."""
    console = Console(page)
    page.goto(args.url)
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    panel = page.locator("#zones-section")
    expect(panel).to_be_visible(timeout=10_000)
    for zone in ["eu-1", "us-1"]:
        item = page.locator(f'#zones li[data-zone="{zone}"]')
        expect(item).to_have_attribute("data-zone-state", "online", timeout=10_000)
        expect(item.locator(".badge")).to_have_text(re.compile("Online"))
        expect(item.locator(".zone-seen")).to_have_text(re.compile(r"last seen"))
        expect(item).to_have_css("border-left-color", OK)
    checks.ok("the zones panel lists eu-1 and us-1 Online, in the ok colour, with their last-seen age")
    rows = page.locator("#dataplanes tbody tr")
    eu = page.locator('#dataplanes tbody tr[data-key="eu-1:default/web"]')
    us = page.locator('#dataplanes tbody tr[data-key="us-1:default/web"]')
    expect(eu).to_have_attribute("data-ready", "true", timeout=10_000)
    expect(us).to_have_attribute("data-ready", "true", timeout=10_000)
    expect(page.locator('#dataplanes thead th[data-sort="zone"]')).to_be_visible()
    expect(eu.locator("td.zone-col")).to_have_text(re.compile(r"eu-1.*Online"))
    checks.ok("the same dataplane name in two zones is two rows, each with its zone in the zone column")
    page.select_option("#zone-filter", "us-1")
    expect(rows).to_have_count(1)
    expect(us).to_be_visible()
    page.select_option("#zone-filter", "")
    expect(rows).to_have_count(2)
    checks.ok("the zone filter shows one zone's rows, then all again")
    expect(page.locator('#services [data-service-zone="eu-1"]')).to_have_text(re.compile("1/1 ready"))
    checks.ok("the services panel counts each service per zone")

    action("freeze us-1")
    started = time.monotonic()
    us_item = page.locator('#zones li[data-zone="us-1"]')
    expect(us_item).to_have_attribute("data-zone-state", "offline", timeout=int(args.detection * 1000) + 5_000)
    took = time.monotonic() - started
    expect(us_item.locator(".badge")).to_have_text(re.compile("Offline"))
    expect(us_item).to_have_css("border-left-color", BAD)
    expect(us.locator("td.zone-col")).to_have_text(re.compile(r"us-1.*Offline"), timeout=5_000)
    expect(page.locator('#zones li[data-zone="eu-1"]')).to_have_attribute("data-zone-state", "online")
    print(f"MEASURE zone_offline_on_page_seconds {took:.2f}", flush=True)
    checks.ok(f"us-1 frozen: Offline in the panel ({took:.1f} s) and on its row, in the bad colour; eu-1 stays Online")
    if args.screenshot:
        page.screenshot(path=args.screenshot, full_page=True)
    action("thaw us-1")
    expect(us_item).to_have_attribute("data-zone-state", "online", timeout=30_000)
    expect(us.locator("td.zone-col")).to_have_text(re.compile(r"us-1.*Online"), timeout=5_000)
    checks.ok("us-1 thawed: Online again in the panel and on its row")
    # The last hour: us-1's band in the timeline went offline and back.
    zone_band = page.locator('#timeline g[data-zone="us-1"]')
    expect(zone_band.locator('rect.seg[data-status="offline"]')).to_have_count(1, timeout=12_000)
    expect(zone_band.locator('rect.seg[data-status="online"]').last).to_be_attached()
    checks.that(page.locator('#timeline g[data-zone="eu-1"] rect.seg[data-status="offline"]').count() == 0,
                "the timeline's zone rows: us-1 offline then online, eu-1 never offline")
    us.locator("button[data-open]").click()
    expect(page.locator('#detail-band rect.seg[data-status="ready"]').last).to_be_attached(timeout=5_000)
    checks.ok("a zone's dataplane has its band in its detail (from the global's history)")
    page.locator("#detail-close").click()
    unexpected = console.unexpected({})
    checks.that(not unexpected, f"no console error or failed API call: {unexpected}")


def timeline(page, args, checks):
    """The last hour: an app stops and comes back; the fleet timeline shows
    the interval its inbound was not ready (an SVG rect with its times), and
    web-1's detail shows the band of its status changes in the page's colours."""
    console = Console(page)
    page.goto(args.url)
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    chart = page.locator("#timeline svg.timeline-chart")
    expect(chart).to_be_visible(timeout=10_000)
    expect(chart).to_have_attribute("data-not-ready-now", "0")
    unhealthy = page.locator('#timeline rect.bar[data-class="unhealthy"]')
    checks.that(unhealthy.count() == 0, "the timeline is drawn (inline SVG) with nothing unhealthy yet")
    checks.that(page.locator("#timeline-section").evaluate(
        "s => s.compareDocumentPosition(document.getElementById('dataplanes')) & Node.DOCUMENT_POSITION_FOLLOWING") > 0,
        "the timeline is above the dataplanes table")

    # The start's pending stretch over first, and a clear bucket after it,
    # so the outage below is an interval of its own.
    page.wait_for_function("""() => [...document.querySelectorAll('#timeline rect.nr-interval')]
        .every(r => Date.parse(r.dataset.to) % 10000 === 0 && Date.parse(r.dataset.to) + 10000 < Date.now())""", timeout=30_000)
    stopped = page.evaluate("Date.now()")
    action("stop_app web-1")
    web1 = row(page, "web-1")
    expect(web1).to_have_attribute("data-ready", "false", timeout=10_000)
    # A visible stretch of not ready: until the history the page polls has it.
    expect(chart).to_have_attribute("data-not-ready-now", "1", timeout=12_000)
    action("start_app web-1")
    expect(web1).to_have_attribute("data-ready", "true", timeout=15_000)
    back = page.evaluate("Date.now()")
    # The page polls the history every 5 s.
    expect(unhealthy.first).to_be_attached(timeout=12_000)
    expect(chart).to_have_attribute("data-not-ready-now", "0", timeout=12_000)
    intervals = page.locator("#timeline rect.nr-interval").evaluate_all(
        "rs => rs.map(r => ({from: Date.parse(r.dataset.from), to: Date.parse(r.dataset.to), max: +r.dataset.max, title: r.textContent}))")
    bucket = 10_000
    hit = [i for i in intervals if i["from"] <= stopped + bucket and i["to"] >= stopped and i["max"] == 1]
    checks.that(hit, f"an interval of not ready covers the stop ({stopped}): {intervals}")
    bars = unhealthy.evaluate_all("rs => rs.map(r => Date.parse(r.dataset.at))")
    checks.that(all(stopped - bucket < t <= back for t in bars),
                f"the unhealthy bars lie in the buckets of the outage ({stopped}..{back}): {bars}")
    checks.that("not ready" in hit[-1]["title"], f"hovering it says when and how many: {hit[-1]['title']!r}")
    legend = page.locator("#timeline .legend")
    checks.that("object" not in legend.inner_text() and legend.locator(".legend-item").count() == 7,
                f"the legend names the 7 classes: {legend.inner_text()!r}")
    colour = unhealthy.first.evaluate("b => getComputedStyle(b).fill")
    checks.that(colour == BAD, f"the unhealthy bar is drawn in the page's 'bad' colour ({colour})")
    if args.screenshot:
        page.locator("#timeline-section").scroll_into_view_if_needed()
        page.screenshot(path=args.screenshot)
        checks.ok(f"screenshot: {args.screenshot}")

    web1.locator("button[data-open]").click()
    dialog = page.locator("#detail")
    expect(dialog).to_be_visible()
    band = dialog.locator("#detail-band svg.band")
    expect(band).to_be_visible(timeout=5_000)
    expect(band.locator('rect.seg[data-status="unhealthy"]')).to_have_count(1, timeout=5_000)
    segs = band.locator("rect.seg").evaluate_all(
        "rs => rs.map(r => ({status: r.dataset.status, from: Date.parse(r.dataset.from), to: Date.parse(r.dataset.to), fill: getComputedStyle(r).fill, title: r.textContent}))")
    statuses = [s["status"] for s in segs]
    checks.that(statuses[-2:] == ["unhealthy", "ready"], f"the band ends unhealthy, then ready: {statuses}")
    bad = segs[-2]
    checks.that(stopped - 1_000 <= bad["from"] <= back and bad["from"] < bad["to"] <= back + 1_000,
                f"the unhealthy stretch lies between the stop and the recovery: {bad} ({stopped}..{back})")
    checks.that(bad["fill"] == BAD and segs[-1]["fill"] == OK, f"colours: unhealthy {bad['fill']}, ready {segs[-1]['fill']}")
    checks.that("unhealthy" in bad["title"] and ":" in bad["title"], f"its title gives the times and the status: {bad['title']!r}")
    changes = dialog.locator(".band-changes li")
    expect(changes.first).to_have_attribute("data-status", "ready")
    expect(changes.nth(1)).to_have_attribute("data-status", "unhealthy")
    checks.ok("the detail lists the changes, newest first: ready, unhealthy")
    if args.screenshot:
        page.screenshot(path=args.screenshot.replace(".png", "-detail.png"))
    page.locator("#detail-close").click()
    unexpected = console.unexpected({})
    checks.that(not unexpected, f"no console error or failed API call: {unexpected}")


def soak(page, args, checks):
    """The page open while an app flaps (hdsd's side flaps it, this side only
    looks between blocks): the heap levels off, no list grows with events."""
    page.goto(args.url)
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    web1 = row(page, "web-1")
    samples = []
    for block in range(args.flaps // 10):
        action("flap web-1 10")
        expect(web1).to_have_attribute("data-ready", "true", timeout=15_000)
        samples.append(heap(page))
        print(f"MEASURE js_heap_bytes after {(block + 1) * 10} flaps {samples[-1]}", flush=True)
    growth = samples[-1] - samples[1]
    checks.that(growth < 256 * 1024, f"the heap levels off: {samples[1]} -> {samples[-1]} bytes after warm-up")


def tls(page, args, checks):
    """An HTTPS probe: the row marks its target TLS, the detail says how
    its TLS is set up, and once its certificate comes from another CA the
    detail's "Why" says a handshake may fail and where to look."""
    page.goto(args.url)
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    secure, plain = row(page, "secure-1"), row(page, "plain-1")
    expect(secure.locator(".ready-cell")).to_have_text(re.compile("Ready"))
    expect(secure.locator('[data-tls="true"]')).to_have_text("TLS")
    checks.that(plain.locator('[data-tls="true"]').count() == 0, "a plaintext probe has no TLS mark")
    checks.ok("the TLS probe's target is marked TLS in its row")
    secure.locator("button[data-open]").click()
    dialog = page.locator("#detail")
    expect(dialog).to_contain_text("HTTP GET over TLS (certificate verified against ")
    expect(dialog).to_contain_text("and must name app.test")
    checks.ok("the detail says the probe runs over TLS, against which CA, for which name")
    page.locator("#detail-close").click()
    action("rogue_cert secure-1")
    expect(secure).to_have_attribute("data-ready", "false", timeout=10_000)
    secure.locator("button[data-open]").click()
    why = dialog.locator('[data-reason="tls_probe_failing"]')
    expect(why).to_contain_text("the handshake may fail")
    expect(why).to_contain_text("ssl.fail_verify_error")
    checks.ok("unhealthy: the detail's Why says a TLS failure may be the cause and which Envoy stats to read")
    page.locator("#detail-close").click()


def large(page, args, checks):
    """A fleet past one API page (5,200 dataplanes from files): the page
    shows hdsd's counts and 500 rows, fetches only those (never the whole
    list), and narrows by service name and Not ready only on the server."""
    console = Console(page)
    asked = []
    page.on("request", lambda r: "/api/v1/dataplanes" in r.url and asked.append(r.url))
    page.goto(args.url)
    expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    expect(count_tile(page, "dataplanes")).to_have_text(str(args.fleet), timeout=10_000)
    rows = page.locator("#dataplanes tbody tr")
    expect(rows).to_have_count(500, timeout=10_000)
    expect(page.locator("#shown")).to_contain_text(f"of {args.fleet} dataplanes, filtered by hdsd", timeout=10_000)
    checks.ok(f"{args.fleet} dataplanes counted by hdsd, 500 rows shown")
    lists = [u for u in asked if "/api/v1/dataplanes?" in u]
    checks.that(lists and all("page_size=500" in u for u in lists),
                f"only pages of the rows shown were fetched: {lists}")
    with page.expect_request(lambda r: "/api/v1/dataplanes?" in r.url and "service=svc-1" in r.url, timeout=10_000):
        page.fill("#filter", "svc-1")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#dataplanes tbody tr')].length > 0 && "
        "[...document.querySelectorAll('#dataplanes tbody tr')].every(tr => tr.textContent.includes('svc-1'))",
        timeout=10_000)
    checks.that(any("service=svc-1" in u for u in asked), "a service name filters on the server")
    page.fill("#filter", "")
    with page.expect_request(lambda r: "/api/v1/dataplanes?" in r.url and "ready=false" in r.url, timeout=10_000):
        page.check("#not-ready")
    page.wait_for_function(
        "() => { const r = [...document.querySelectorAll('#dataplanes tbody tr')];"
        " return r.length === 500 && r.every(tr => tr.dataset.ready === 'false'); }",
        timeout=10_000)
    checks.that(any("ready=false" in u for u in asked), "Not ready only filters on the server")
    bytes_used = heap(page)
    checks.that(0 < bytes_used < 64 << 20, f"the page's heap stays small: {bytes_used} bytes")
    unexpected = console.unexpected({})
    checks.that(not unexpected, f"no console errors: {unexpected}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--scenario", choices=["live", "token", "soak", "fleet", "zones", "tls", "timeline", "large"], required=True)
    parser.add_argument("--flaps", type=int, default=60)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--screenshot")
    parser.add_argument("--detection", type=float, default=1.0)
    parser.add_argument("--token")
    parser.add_argument("--fleet", type=int, default=0)
    args = parser.parse_args()
    checks = Checks()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True,
                                    args=["--js-flags=--expose-gc", "--enable-precise-memory-info"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(10_000)
            {"live": live, "token": token, "soak": soak, "fleet": fleet, "zones": zones, "tls": tls, "timeline": timeline, "large": large}[args.scenario](page, args, checks)
        finally:
            browser.close()
    print(f"PASSED {checks.count} checks", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the reason goes to the Rust test
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
