"""Pinned versions of the control-plane tools (see versions.env)."""
