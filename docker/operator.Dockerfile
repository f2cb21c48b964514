# syntax=docker/dockerfile:1.7
# The torchflex operator image: kopf + the Kubernetes client, never torch.
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/torchflex/torchflex-operator:0.1.0 .
#
# Build context: the repository root. Dependencies are installed with the
# project's exact pins (constraints.txt). docs/operations.md says how to build,
# push and pin the base image by digest.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/torchflex
WORKDIR /src
# Dependencies before the sources: the venv holds the [operator] extra's requirements (read
# from pyproject.toml), in layers keyed by pyproject.toml and constraints.txt only. The final
# stage starts FROM this stage, so a code change rebuilds and pushes only the project's own
# layer (/opt/torchflex-app, seen by the venv through a .pth file), not the ~200 MB venv.
COPY pyproject.toml constraints.txt ./
RUN /opt/torchflex/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["operator"]))' >/tmp/requirements.txt \
    && /opt/torchflex/bin/pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && /opt/torchflex/bin/python -c 'import pathlib, site; pathlib.Path(site.getsitepackages()[0], "torchflex-app.pth").write_text("/opt/torchflex-app\n")' \
    && /opt/torchflex/bin/python -m compileall -q /opt/torchflex/lib

FROM deps AS build
COPY README.md ./
COPY contract/ contract/
COPY operator/ operator/
COPY agent/ agent/
# The [operator] extra only: the build fails here if torch ever becomes a dependency of it.
# --upgrade: --target skips a top-level directory that exists.
RUN /opt/torchflex/bin/pip install -c constraints.txt --no-deps --upgrade --target /opt/torchflex-app ".[operator]" \
    && ! /opt/torchflex/bin/python -c "import torch" 2>/dev/null \
    && /opt/torchflex-app/bin/torchflex-operator --help >/dev/null \
    && /opt/torchflex/bin/python -m compileall -q /opt/torchflex-app

FROM deps
LABEL org.opencontainers.image.title="torchflex-operator" \
      org.opencontainers.image.description="Reconciles torchflex.io ElasticJobs (no torch inside)" \
      org.opencontainers.image.source="https://github.com/torchflex/torchflex" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/torchflex-app/bin:/opt/torchflex/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The code last: a change to it rebuilds and pushes this layer alone.
COPY --from=build /opt/torchflex-app /opt/torchflex-app
# Numeric non-root user (the chart's securityContext runs as 65532 too; no /etc/passwd entry needed).
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["torchflex-operator"]
CMD ["--all-namespaces"]
