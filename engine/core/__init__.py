"""The engine's core: the Engine, its loop, the scheduler, the model runner, sequences and the request types."""
