"""Qwen Desk: the desktop app (PySide6). It knows the engine only through engine.api."""
