# syntax=docker/dockerfile:1.7
# The torchflex agent base image: torch + torchflex-agent. Build your training
# image FROM it and add your code:
#
#   docker build -f docker/agent.Dockerfile -t ghcr.io/torchflex/torchflex-agent:0.1.0-cpu .
#   docker build -f docker/agent.Dockerfile --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#       -t ghcr.io/torchflex/torchflex-agent:0.1.0-cu128 .
#
#   # your Dockerfile
#   FROM ghcr.io/torchflex/torchflex-agent:0.1.0-cpu
#   COPY --chown=65532:65532 train.py /workspace/
#
# The operator wraps the ElasticJob's command in `torchflex-agent --` and runs
# the rendezvous store pod as `torchflex-agent store` from the same image.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS torch
# CPU wheels by default; a CUDA index (e.g. .../whl/cu128) gives GPU torch (CUDA libs come as wheels).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/torchflex
WORKDIR /src
# Dependencies before the sources, so a code change rebuilds from the COPY of the sources
# on (seconds). The venv holds torch alone (GBs with a CUDA build; from its own index with
# its exact pin), in a layer keyed by constraints.txt only. The final stage starts FROM this
# stage, so it inherits that layer as is: nothing copies it, and no builder has to hash GBs
# to find a cached copy (buildah took 30 s per build doing so). The agent extra's other
# requirements (read from pyproject.toml) and then the project go to /opt/torchflex-app,
# which the venv sees through a .pth file.
COPY constraints.txt ./
RUN /opt/torchflex/bin/pip install -c constraints.txt --index-url "${TORCH_INDEX_URL}" torch \
    && /opt/torchflex/bin/python -c 'import pathlib, site; pathlib.Path(site.getsitepackages()[0], "torchflex-app.pth").write_text("/opt/torchflex-app\n")'

FROM torch AS build
COPY pyproject.toml ./
RUN /opt/torchflex/bin/python -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(r for r in p["dependencies"] + p["optional-dependencies"]["agent"] if re.split(r"[^A-Za-z0-9._-]", r)[0] != "torch"))' >/tmp/requirements.txt \
    && /opt/torchflex/bin/pip install -c constraints.txt --target /opt/torchflex-app -r /tmp/requirements.txt
COPY README.md ./
COPY contract/ contract/
COPY operator/ operator/
COPY agent/ agent/
# --upgrade: --target skips a top-level directory that exists (bin/, from the requirements).
RUN /opt/torchflex/bin/pip install -c constraints.txt --no-deps --upgrade --target /opt/torchflex-app ".[agent]" \
    && PATH=/opt/torchflex-app/bin:$PATH torchflex-agent --help >/dev/null

FROM torch
LABEL org.opencontainers.image.title="torchflex-agent" \
      org.opencontainers.image.description="torch + torchflex-agent: base image for ElasticJob training images" \
      org.opencontainers.image.source="https://github.com/torchflex/torchflex" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/torchflex-app/bin:/opt/torchflex/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/workspace
WORKDIR /workspace
# The example job (examples/elasticjob-*.yaml) runs this script from the image.
RUN chown 65532:65532 /workspace
COPY --chown=65532:65532 examples/train_elastic.py /workspace/examples/train_elastic.py
# The code last: a change to it rebuilds and pushes this layer alone.
COPY --from=build /opt/torchflex-app /opt/torchflex-app
# Numeric non-root user: Kubernetes can check runAsNonRoot without /etc/passwd.
USER 65532:65532
# Agent health/status (29410) and the c10d store (29400, store pod only).
EXPOSE 29400 29410
CMD ["torchflex-agent", "--help"]
