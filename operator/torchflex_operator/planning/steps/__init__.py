"""The planner's steps, one module per concern, each step a pure ``(Ctx, Draft) -> Draft``.
May import: ``planning.context``, ``planning.ledger``, ``planning.rules``, ``render``, ``model``."""
