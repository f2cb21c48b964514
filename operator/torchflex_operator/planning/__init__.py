"""All pure decisions: ``plan(job, status, observed, now) -> Plan``, its steps and rules.
May import: ``render``, ``model`` and ``torchflex_contract`` (no I/O, no clock, no logging)."""

from torchflex_operator.planning.pipeline import plan as plan
