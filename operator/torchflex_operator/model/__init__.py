"""Frozen values the operator reasons about: spec, status, observed pods, plan, words, settings.
May import: the standard library and ``torchflex_contract`` only (no I/O, no clock, no logging)."""
