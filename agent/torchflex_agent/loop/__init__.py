"""The agent loop: ElasticAgent, its store session, round supervision, standby, health, flags.

May import workers, rendezvous, stores, memstate, progress, fence, errors; never state or peer."""
