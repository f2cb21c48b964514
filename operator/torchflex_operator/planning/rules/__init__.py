"""Pure rules the steps consult (classify a failure, judge completion, pace creation, ...).
May import: ``render``, ``model`` and ``torchflex_contract``; never a step or the pipeline."""
