"""The state API's pure decisions: copy keys and sources, shard holders, process-group links.

May import only other pure modules and the contract: no I/O, clock, logging or torch."""
