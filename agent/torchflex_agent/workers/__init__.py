"""A round's worker processes: the group (launch, env, poll, stop), fork server, root cause.

May import rendezvous, stores, memstate, progress, fence, errors; never the loop above it."""
