"""The rendezvous over a KVStore: protocol, its records, pure logic, liveness, presence probes.

May import stores, memstate, progress, fence, errors; never workers or the loop above it."""
