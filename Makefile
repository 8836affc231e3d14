# The README's contract: `make serve` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?=
REPOSITORY ?= model_repository
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PROXY_PORT ?= 8080
export HTTP_PORT GRPC_PORT METRICS_PORT PROXY_PORT
# Debian packages: libb64 for perf_analyzer; wrk, the HTTP load generator of `make bench`.
DEB_PACKAGES := libb64-0d wrk
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup export serve test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	@dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(DEB_PACKAGES); }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

# Export MODEL (default BAAI/bge-m3) into the repository.
export: setup
	$(PY) build/export.py --repository $(REPOSITORY) $(if $(MODEL),--model "$(MODEL)")

# Export only if needed (no export yet, or MODEL differs from the exported one), then serve.
serve: setup
	$(PY) build/export.py --repository $(REPOSITORY) --skip-if-exported $(if $(MODEL),--model "$(MODEL)")
	$(PY) -m local_triton.launch --model-repository $(REPOSITORY)

test: setup
	$(PY) -m pytest tests

bench: setup
	$(PY) -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .triton
