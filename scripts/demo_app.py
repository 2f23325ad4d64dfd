#!/usr/bin/env python3
"""A tiny HTTP application for hdsd's demo: answers every GET with `hello from NAME`.

    scripts/demo_app.py --port 18081 --name web
    scripts/demo_app.py --port 18081 --name web --host 0.0.0.0   # in a container

Envoy only opens TCP connections to it (hdsd's health checks are TCP), but a
person can `curl` it too. Exits cleanly (status 0) on SIGTERM or SIGINT.
Python 3 standard library only.
"""

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Stop(Exception):
    """Raised by the signal handler to leave serve_forever()."""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--name", required=True, help="name to answer with")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    args = parser.parse_args()
    body = f"hello from {args.name}\n".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()

        def log_message(self, fmt, *a):
            sys.stderr.write(f"{args.name}: {self.address_string()} {fmt % a}\n")

    def stop(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        print(f"{args.name}: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    server.daemon_threads = True
    print(f"{args.name}: listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except Stop as s:
        print(f"{args.name}: {s}, stopping", file=sys.stderr, flush=True)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
