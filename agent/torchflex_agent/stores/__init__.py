"""The key-value stores: the backend registry, KVStore, TCP and etcd clients, the store server.

May import memstate, progress, fence, errors (in practice only errors); nothing above it."""
