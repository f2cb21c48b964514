"""The state API's internals without torch: in-memory copies (shm), unblocking, pure logic.

May import fence and errors only; never torch, state or peer (the agent imports it)."""
