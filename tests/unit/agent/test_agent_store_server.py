"""``torchflex-agent store``'s resolver options: one 1 s try per lookup, unless the caller chose.

torch's TCPStore server looks up each accepted peer on its one event-loop
thread (``tests/integration/agent/test_store_resolver.py`` shows it), so a
lost DNS answer stalls every client; the store bounds that wait itself.
"""

from __future__ import annotations

from torchflex_agent.stores import server as store_server


def test_the_store_makes_a_lookup_one_short_try() -> None:
    assert store_server.resolver_env({}) == {"RES_OPTIONS": "timeout:1 attempts:1"}
    assert store_server.resolver_env({"PATH": "/bin"}) == {
        "RES_OPTIONS": store_server.RESOLVER_OPTIONS
    }


def test_a_callers_own_resolver_options_are_kept() -> None:
    assert store_server.resolver_env({"RES_OPTIONS": "timeout:3"}) == {}
