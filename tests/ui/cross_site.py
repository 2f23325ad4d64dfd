#!/usr/bin/env python3
"""Pages of other sites try to write through hdsd's open API in a real headless
Chromium (Playwright), as an attacker's page would.

Run by tests/ui_browser.rs, which starts a global hdsd with zone ap-1
registered and disabled. The pages are served by Playwright itself (a route
answers their URL), so no other server is needed:

- a page of another origin (http://127.0.0.1:OTHER/) sends the finding's
  `fetch(POST .../zones/ap-1/enable, {mode: "no-cors"})`, a text/plain POST
  and an auto-submitted form;
- a page of a DNS name that resolves to this machine (Chromium's host
  resolver maps evil.example to 127.0.0.1: DNS rebinding) is, to the
  browser, the API's own origin: it sends `DELETE /api/v1/zones/ap-1` and
  reads the answer;
- hdsd's own page origin (the API's) enables the zone with a JSON POST.

Between the steps the script reads the zone's state from the API's own
origin. Prints `CHECK <what>` per assertion, `RESULT <name> <value>` for the
Rust side, and `PASSED <n> checks`; a failed check exits non-zero.

    cross_site.py --api http://127.0.0.1:PORT --chromium /usr/bin/chromium
"""

import argparse
import sys
from urllib.parse import urlparse

from playwright.sync_api import sync_playwright

ATTACK = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" target="sink"
      action="{api}/api/v1/zones/ap-1/enable"><input name="x" value="y"></form>
<iframe name="sink"></iframe>
<script>
window.attack = async () => {{
  const sent = [];
  for (const init of [
    {{ method: "POST", mode: "no-cors" }},
    {{ method: "POST", mode: "no-cors", body: "{{}}", headers: {{ "Content-Type": "text/plain" }} }},
  ]) {{
    try {{ await fetch("{api}/api/v1/zones/ap-1/enable", init); sent.push("sent"); }}
    catch (e) {{ sent.push("failed: " + e); }}
  }}
  document.getElementById("f").submit();
  return sent;
}};
</script></body></html>"""

REBOUND = """<!doctype html><html><body><script>
window.attack = async () => {
  const r = await fetch("/api/v1/zones/ap-1", { method: "DELETE" });
  return r.status + " " + (await r.text());
};
</script></body></html>"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--chromium", required=True)
    args = parser.parse_args()
    api = args.api.rstrip("/")
    port = urlparse(api).port
    checks = 0

    def check(condition, what):
        nonlocal checks
        if not condition:
            raise AssertionError(what)
        checks += 1
        print(f"CHECK {what}", flush=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium,
            args=[f"--host-resolver-rules=MAP evil.example 127.0.0.1", "--no-sandbox"],
        )
        context = browser.new_context()

        def zone_state():
            own = context.new_page()
            own.goto(f"{api}/ui/")
            state = own.evaluate(
                """async () => {
                  const r = await fetch("/api/v1/zones/ap-1", { cache: "no-store" });
                  return r.status === 200 ? (await r.json()).state : "status " + r.status;
                }"""
            )
            own.close()
            return state

        check(zone_state() == "disabled", "ap-1 starts disabled")

        # Another origin: the finding's no-cors POST, a text/plain POST, a form.
        other = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}"
        context.route(
            f"{other}/attack.html",
            lambda route: route.fulfill(
                status=200, content_type="text/html", body=ATTACK.format(api=api)
            ),
        )
        page = context.new_page()
        page.goto(f"{other}/attack.html")
        sent = page.evaluate("window.attack()")
        print(f"RESULT cross_site_sent {','.join(s.replace(' ', '_') for s in sent)}", flush=True)
        # The form's answer loads in the frame: wait for it.
        page.wait_for_function(
            "() => { try { return frames[0].document.readyState === 'complete' && frames[0].location.href !== 'about:blank'; } catch (e) { return true; } }",
            timeout=10_000,
        )
        page.close()
        state = zone_state()
        print(f"RESULT after_cross_site {state}", flush=True)
        check(state == "disabled", f"a page of another origin did not enable ap-1 (state {state})")

        # DNS rebinding: evil.example resolves to this machine.
        rebound = f"http://evil.example:{port}"
        context.route(
            f"{rebound}/attack.html",
            lambda route: route.fulfill(status=200, content_type="text/html", body=REBOUND),
        )
        page = context.new_page()
        page.goto(f"{rebound}/attack.html")
        answer = page.evaluate("window.attack()")
        page.close()
        print(f"RESULT rebound_delete {answer.split()[0]}", flush=True)
        check(answer.startswith("403 "), f"a rebound DNS name's DELETE is refused: {answer[:300]}")
        check("api.allowed_hosts" in answer, "the refusal names api.allowed_hosts")
        state = zone_state()
        check(state == "disabled", f"ap-1 is still there (state {state})")

        # The API's own origin writes with a JSON body.
        own = context.new_page()
        own.goto(f"{api}/ui/")
        status = own.evaluate(
            """async () => (await fetch("/api/v1/zones/ap-1/enable", {
                 method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" })).status"""
        )
        own.close()
        check(status == 200, f"the API's own origin enables ap-1 with JSON (status {status})")
        state = zone_state()
        print(f"RESULT after_own {state}", flush=True)
        check(state != "disabled", f"ap-1 is enabled (state {state})")
        browser.close()
    print(f"PASSED {checks} checks", flush=True)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED {e}", flush=True)
        sys.exit(1)
