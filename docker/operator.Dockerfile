# syntax=docker/dockerfile:1.7
# The torchflex operator image: kopf + the Kubernetes client, never torch.
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/torchflex/torchflex-operator:0.1.0 .
#
# Build context: the repository root. Dependencies are installed with the
# project's exact pins (constraints.txt). docs/operations.md says how to build,
# push and pin the base image by digest.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/torchflex
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY contract/ contract/
COPY operator/ operator/
COPY agent/ agent/
# The [operator] extra only: the build fails here if torch ever becomes a dependency of it.
RUN /opt/torchflex/bin/pip install -c constraints.txt ".[operator]" \
    && ! /opt/torchflex/bin/python -c "import torch" 2>/dev/null \
    && /opt/torchflex/bin/python -m compileall -q /opt/torchflex/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="torchflex-operator" \
      org.opencontainers.image.description="Reconciles torchflex.io ElasticJobs (no torch inside)" \
      org.opencontainers.image.source="https://github.com/torchflex/torchflex" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/torchflex/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/torchflex /opt/torchflex
# Numeric non-root user (the chart's securityContext runs as 65532 too; no /etc/passwd entry needed).
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["torchflex-operator"]
CMD ["--all-namespaces"]
