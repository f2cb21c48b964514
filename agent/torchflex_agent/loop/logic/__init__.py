"""The loop's pure decisions: flags -> AgentConfig (config), observation -> action (policy).

May import only pure modules (``**.logic``, errors) and the contract: no I/O, clock, logging."""
