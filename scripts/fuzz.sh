#!/usr/bin/env bash
# Fuzzes hdsd's parsers of untrusted input with cargo fuzz (libFuzzer):
#
#   scripts/fuzz.sh [seconds per target] [target...]
#
# FUZZ_JOBS (default: the number of cores, at most 4) targets run at a time,
# each with its output kept in a log shown when it ends. FUZZ_SANITIZER
# (default none) is cargo fuzz's --sanitizer: hdsd forbids unsafe code, so
# the address sanitizer can only find bugs in its dependencies' unsafe code;
# without it the build takes a third less time and a target runs 6 to 14
# times as many inputs in the same time (docs/development.md, "Fuzzing"). For a long run
# over the dependencies too: FUZZ_SANITIZER=address scripts/fuzz.sh 600.
#
# Targets (fuzz/fuzz_targets/): dataplane_file (the Dataplane YAML/JSON parser
# and its limits), token_verify (the token verifier), config_load (the
# configuration loader and validation), report_fold (Envoy's health reports
# folded into readiness), lean_codecs (hdsd's own readers of HDS and EDS
# requests, against prost's). Default: every target, 30 s each (what CI runs).
# Each target's corpus (fuzz/corpus/<target>/) is seeded from the test
# fixtures (testdata/, examples/, docker/) and grows across runs; a crash
# ends the run with a non-zero exit and leaves its input in
# fuzz/artifacts/<target>/ (replay: cargo fuzz run -O -s none <target> <file>).
#
# cargo fuzz passes nightly compiler flags (-Z..., -Zsanitizer=address with
# the sanitizer); the stable compiler accepts them with RUSTC_BOOTSTRAP=1,
# set here.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(dataplane_file token_verify config_load report_fold lean_codecs)
fi
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# seed TARGET SELECTOR FILE...: copies each file into the target's corpus,
# behind a first byte that picks the input's form (the targets read it).
seed() {
    local target="$1" selector="$2"
    shift 2
    mkdir -p "fuzz/corpus/$target"
    for f in "$@"; do
        [ -f "$f" ] || continue
        local name
        name="seed-$selector-$(basename "$f")"
        { printf "\\x$selector"; cat "$f"; } >"fuzz/corpus/$target/$name"
    done
}
seed dataplane_file 00 testdata/kuma/*.yaml testdata/kuma-invalid/*.yaml examples/dataplanes/*.yaml
seed dataplane_file 01 testdata/kuma/*.json
seed config_load 00 examples/hdsd.toml docker/hdsd.toml
seed config_load 01 testdata/envoy/*.yaml
mkdir -p fuzz/corpus/token_verify
cp testdata/envoy/token fuzz/corpus/token_verify/seed-token
# Three lines: header, claims, signature (the target encodes them, with the
# trusted key's id in place of KID).
{
    printf '{"alg":"EdDSA","typ":"JWT","kid":"KID"}\n'
    printf '{"mesh":"default","name":"web-01","iat":1800000000,"exp":1900000000,"jti":"00"}\n'
    head -c 64 /dev/zero
} >fuzz/corpus/token_verify/seed-parts
seed report_fold 00 testdata/kuma/dataplane.json
seed report_fold 01 testdata/kuma/dataplane.json
# lean_codecs: an HDS first request (node id default.web-01) and an EDS
# stream of two requests, the second naming the same clusters (selector 01).
mkdir -p fuzz/corpus/lean_codecs
printf '\x00\x0a\x12\x0a\x10\x0a\x0edefault.web-01' >fuzz/corpus/lean_codecs/seed-hds-request
printf '\x01\x1a\x03web\x1a\x03api\xff\x00\x1a\x03web\x1a\x03api' >fuzz/corpus/lean_codecs/seed-eds-requests

sanitizer="${FUZZ_SANITIZER:-none}"
jobs="${FUZZ_JOBS:-$(nproc)}"
[ "$jobs" -le 4 ] || jobs=4
cargo fuzz build -O -s "$sanitizer"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# run TARGET: fuzzes one target, its output in $logs/TARGET.log, its exit
# status in $logs/TARGET.rc.
run() {
    local rc=0
    cargo fuzz run -O -s "$sanitizer" "$1" "fuzz/corpus/$1" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$logs/$1.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/$1.rc"
}
running=0
for target in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "== $target: ${seconds}s (sanitizer: $sanitizer)"
    run "$target" &
    running=$((running + 1))
done
wait

failed=()
for target in "${targets[@]}"; do
    rc=$(cat "$logs/$target.rc" 2>/dev/null || echo 1)
    if [ "$rc" -ne 0 ]; then
        echo "== $target: FAILED (exit $rc); its output:"
        cat "$logs/$target.log"
        failed+=("$target")
    else
        echo "== $target: $(grep -m1 -E '^Done [0-9]+ runs' "$logs/$target.log" || echo 'done'), no crash"
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: ${failed[*]} failed; a crash's input is in fuzz/artifacts/<target>/" \
        "(replay: cargo fuzz run -O -s $sanitizer <target> <file>)" >&2
    exit 1
fi
