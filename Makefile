# The two commands a newcomer needs:
#   make demo   - hdsd with real Envoys and demo apps on this machine
#   make test   - every test (installs Envoy and Prometheus first)
.PHONY: demo test setup standins-warmup lint build bench bench-instructions bench-baseline fuzz

CARGO ?= cargo

setup:
	@./scripts/setup.sh >/dev/null

build:
	$(CARGO) build --release --bins

# ARGS are passed to the demo, e.g. make demo ARGS=--once, or ARGS=--zones for the
# multi-zone story (see ./scripts/demo.py --help).
# It installs only what the demo needs (Envoy, into .venv: `scripts/setup.sh
# --demo`), not the tests' tools. Ctrl-C ends an interactive demo with exit 0.
demo: build
	@ENVOY_BIN="$$(./scripts/setup.sh --demo | tail -n 1)" && export ENVOY_BIN && \
	  exec ./scripts/demo.py --hdsd "$${CARGO_TARGET_DIR:-target}/release/hdsd" $(ARGS)

# The dependency policy (deny.toml) needs cargo-deny, which scripts/setup.sh
# installs. Advisories are not checked: their database comes from the
# network (docs/development.md, "Toolchain and lints").
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features fault-injection -- -D warnings
	@$(CARGO) deny --version >/dev/null 2>&1 || { echo "lint: cargo-deny is missing: scripts/setup.sh installs it" >&2; exit 1; }
	$(CARGO) deny check --hide-inclusion-graph licenses bans sources

# The compose test's stand-in images (tests/compose/standins.sh: about two
# minutes of debootstrap and `docker import` on a fresh machine) are built in
# the background while the lint and the build run; the test's own call of the
# script waits for that build (the script holds a lock) and reuses its images.
# Its log: target/standins-warmup.log. Without a Docker engine: nothing.
standins-warmup: setup
	@if docker version >/dev/null 2>&1; then \
	  mkdir -p "$${CARGO_TARGET_DIR:-target}"; \
	  ENVOY_BIN="$$(./scripts/setup.sh)" tests/compose/standins.sh \
	    >"$${CARGO_TARGET_DIR:-target}/standins-warmup.log" 2>&1 </dev/null & \
	fi

# The demo stories (single-zone, then --zones) run last, non-interactively,
# with the debug hdsd that `cargo test` has just built (no extra release build).
# The tests build with the `fault-injection` feature: the supervision tests
# (tests/supervision.rs) make tasks of the real binary fail through it.
test: setup standins-warmup lint
	ENVOY_BIN="$$(./scripts/setup.sh)" $(CARGO) test --features fault-injection --lib --bins --tests -- --test-threads=2
	CARGO="$(CARGO)" ./scripts/instructions.py check
	ENVOY_BIN="$$(./scripts/setup.sh)" ./scripts/demo.py --once --hdsd "$${CARGO_TARGET_DIR:-target}/debug/hdsd"
	ENVOY_BIN="$$(./scripts/setup.sh)" ./scripts/demo.py --once --zones --hdsd "$${CARGO_TARGET_DIR:-target}/debug/hdsd"

# Load scenarios and micro-benchmarks (BENCHMARKS.md); SCENARIOS picks some, e.g.
# make bench SCENARIOS="steady10k storm10k".
bench:
	./scripts/bench.sh $(SCENARIOS)

# The performance regression guard (part of `make test`): hot paths counted in
# instructions under valgrind, compared with benches/baseline.json (fails on
# +10 %). bench-baseline rewrites the baseline on purpose: commit it with the
# change that explains it (BENCHMARKS.md, "Regression guard").
bench-instructions: setup
	CARGO="$(CARGO)" ./scripts/instructions.py check

bench-baseline: setup
	CARGO="$(CARGO)" ./scripts/instructions.py update

# Fuzzing (docs/development.md, "Fuzzing"): every target for FUZZ_SECONDS (default 30) each,
# FUZZ_JOBS at a time, without a sanitizer unless FUZZ_SANITIZER=address.
# Not part of `make test`: its build of every dependency for fuzzing takes
# longer than the runs (docs/development.md, "Fuzzing").
FUZZ_SECONDS ?= 30
fuzz:
	./scripts/fuzz.sh $(FUZZ_SECONDS)
