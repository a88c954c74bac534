"""The engine's IPC cost: the same requests through an engine process and through the in-process batcher."""
