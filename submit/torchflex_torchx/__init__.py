"""TorchX scheduler ``torchflex``: ``torchx run -s torchflex dist.ddp -j 2:4x1`` -> an ElasticJob.

Where it sits: a client-side package beside the operator, the agent and the
contract, installed with the ``torchx`` extra and registered under the
``torchx.schedulers`` entry point group. ``translate`` turns a TorchX AppDef
into an ElasticJob manifest and a job's status into TorchX's vocabulary (pure);
``scheduler`` talks to the Kubernetes API (submit, describe, list, logs,
cancel). It imports neither the operator nor the agent (import-linter): what
it shares with them comes from ``torchflex_contract``.
"""
