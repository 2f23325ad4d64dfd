#!/usr/bin/env python3
"""hdsd's performance regression guard: hot paths counted in instructions.

Builds the `instructions` bench (benches/instructions.rs), runs each of its
benchmarks under `valgrind --tool=callgrind`, counting only the measured
iterations (`--toggle-collect`), and compares the instructions per iteration
with the committed baseline (benches/baseline.json). Instruction counts do not
depend on the machine's load: the same binary and input give the same count.

  scripts/instructions.py            # check: fail when one grows > 10 %
  scripts/instructions.py update     # write the current counts as the baseline
  scripts/instructions.py --profile release check

The baseline holds one set of counts per Cargo profile (`dev` by default: it
reuses what `cargo test` already built). Counts change with the Rust
toolchain too: the baseline records the `rustc` it was made with, and a check
with another one says so.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "benches" / "baseline.json"
TOLERANCE = 0.10
MEASURED = "*hdsd_bench_measured*"


def fail(message):
    print(f"instructions: {message}", file=sys.stderr)
    sys.exit(1)


def build(profile):
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "build", "--bench", "instructions", "--message-format=json-render-diagnostics"]
    if profile != "dev":
        cmd += ["--profile", profile]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        fail(f"building the bench failed: {' '.join(cmd)}")
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if (
            msg.get("reason") == "compiler-artifact"
            and msg["target"]["name"] == "instructions"
            and msg.get("executable")
        ):
            return msg["executable"]
    fail("cargo built no `instructions` executable")


def rustc_version():
    rustc = os.environ.get("RUSTC", "rustc")
    return subprocess.run([rustc, "--version"], stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def count(exe, name, iterations, workdir):
    out_file = Path(workdir) / (re.sub(r"[^A-Za-z0-9]+", "_", name) + ".callgrind")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--toggle-collect={MEASURED}",
        f"--callgrind-out-file={out_file}",
        exe,
        "run",
        name,
    ]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        fail(f"{name}: {' '.join(cmd)} failed:\n{run.stderr}")
    totals = re.search(r"^totals:\s+(\d+)", out_file.read_text(), re.MULTILINE)
    if not totals or int(totals.group(1)) == 0:
        fail(f"{name}: callgrind counted nothing in {MEASURED}; was the function inlined or renamed?")
    return round(int(totals.group(1)) / iterations)


def measure(profile, jobs):
    if shutil.which("valgrind") is None:
        fail("valgrind is not installed; run scripts/setup.sh (or apt-get install valgrind)")
    exe = build(profile)
    listed = subprocess.run([exe, "list"], stdout=subprocess.PIPE, text=True, check=True).stdout
    benches = [(name, int(n)) for name, n in (line.split() for line in listed.splitlines())]
    with tempfile.TemporaryDirectory() as workdir, concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        counts = pool.map(lambda b: count(exe, b[0], b[1], workdir), benches)
        return dict(zip((b[0] for b in benches), counts))


def load_baseline():
    if not BASELINE.exists():
        return {}
    return json.loads(BASELINE.read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="check", choices=["check", "update"])
    parser.add_argument("--profile", default=os.environ.get("PROFILE", "dev"), help="Cargo profile (default dev)")
    parser.add_argument("--jobs", type=int, default=2, help="valgrind runs at once (default 2)")
    args = parser.parse_args()

    current = measure(args.profile, args.jobs)
    baseline = load_baseline()
    rustc = rustc_version()

    if args.command == "update":
        old = baseline.get(args.profile, {}).get("instructions_per_iteration", {})
        baseline[args.profile] = {"rustc": rustc, "instructions_per_iteration": current}
        BASELINE.write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")
        print(f"{'benchmark':<24} {'before':>12} {'after':>12}")
        for name, after in current.items():
            before = old.get(name)
            print(f"{name:<24} {before if before is not None else '-':>12} {after:>12}")
        print(f"wrote {BASELINE.relative_to(ROOT)} ({args.profile}); commit it with the change that explains it")
        return

    entry = baseline.get(args.profile)
    if entry is None:
        fail(f"no `{args.profile}` baseline in {BASELINE.relative_to(ROOT)}; create it with "
             f"`scripts/instructions.py --profile {args.profile} update`")
    before_all = entry["instructions_per_iteration"]
    if entry.get("rustc") != rustc:
        print(f"instructions: note: the baseline was made with {entry.get('rustc')}, this is {rustc}; "
              "a compiler change can move the counts (update the baseline if it did)")
    worse = []
    print(f"instructions per iteration ({args.profile} profile), limit +{TOLERANCE:.0%}:")
    print(f"{'benchmark':<24} {'before':>12} {'after':>12} {'change':>8}")
    for name, after in current.items():
        before = before_all.get(name)
        if before is None:
            print(f"{name:<24} {'-':>12} {after:>12}      new")
            worse.append(f"{name} has no baseline")
            continue
        change = (after - before) / before
        flag = "  FAIL" if change > TOLERANCE else ""
        print(f"{name:<24} {before:>12} {after:>12} {change:>+8.1%}{flag}")
        if change > TOLERANCE:
            worse.append(f"{name} grew {change:+.1%} ({before} -> {after})")
    for name in before_all.keys() - current.keys():
        print(f"{name:<24} (in the baseline, no longer measured)")
    if worse:
        fail("regression guard failed:\n  " + "\n  ".join(worse) + "\n"
             "If the growth is intended, update the baseline on purpose: `make bench-baseline`, "
             "and commit benches/baseline.json with the reason.")
    print("instructions: within the baseline")


if __name__ == "__main__":
    main()
