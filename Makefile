# The two commands a newcomer needs:
#   make demo   - hdsd with real Envoys and demo apps on this machine
#   make test   - every test (installs Envoy and Prometheus first)
.PHONY: demo test setup lint build bench

CARGO ?= cargo

setup:
	@./scripts/setup.sh >/dev/null

build:
	$(CARGO) build --release --bins

# ARGS are passed to the demo, e.g. make demo ARGS=--once (see ./scripts/demo.py --help).
demo: setup build
	ENVOY_BIN="$$(./scripts/setup.sh)" ./scripts/demo.py --hdsd "$${CARGO_TARGET_DIR:-target}/release/hdsd" $(ARGS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

# The demo story runs last, non-interactively, with the debug hdsd that
# `cargo test` has just built (no extra release build).
test: setup lint
	ENVOY_BIN="$$(./scripts/setup.sh)" $(CARGO) test --lib --bins --tests -- --test-threads=2
	ENVOY_BIN="$$(./scripts/setup.sh)" ./scripts/demo.py --once --hdsd "$${CARGO_TARGET_DIR:-target}/debug/hdsd"

# Load scenarios and micro-benchmarks (BENCHMARKS.md); SCENARIOS picks some, e.g.
# make bench SCENARIOS="steady10k storm10k".
bench:
	./scripts/bench.sh $(SCENARIOS)
