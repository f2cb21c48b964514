"""The state API's torch side: copies to a ring peer over gloo, and small JSON collectives.

May import memstate, progress, fence, errors and torch; only ``state`` imports it."""
