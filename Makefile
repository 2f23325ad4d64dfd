# The two commands a newcomer needs:
#   make demo   - hdsd with real Envoys and demo apps on this machine
#   make test   - every test (installs Envoy and Prometheus first)
.PHONY: demo test setup lint build

CARGO ?= cargo

setup:
	@./scripts/setup.sh >/dev/null

build:
	$(CARGO) build --release --bins

demo: setup build
	./scripts/demo.sh $(ARGS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

test: setup lint
	ENVOY_BIN="$$(./scripts/setup.sh)" $(CARGO) test --all-targets -- --test-threads=2
