"""A conversation's own sampling: the AppSettings fields it overrides, and named presets of them.

Presets are kept in the store (one setting); the built-in ones (the Qwen3 model cards' advice for
thinking and non-thinking replies, and a low-temperature one) cannot be deleted or overwritten.
"""

from __future__ import annotations

from app.settings import AppSettings
from app.store import Store

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "max_tokens")
PRESETS_KEY = "sampling_presets"
BUILT_IN = {
    "Qwen3 card: thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
    "Qwen3 card: no thinking": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0},
    "Precise": {"temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.0},
}


def overrides(values: dict, defaults: AppSettings) -> dict:
    """The sampling fields in `values` that differ from the defaults (what a conversation keeps)."""
    return {k: values[k] for k in SAMPLING_FIELDS if k in values and values[k] != getattr(defaults, k)}


def apply_overrides(defaults: AppSettings, sampling: dict) -> AppSettings:
    """The settings a conversation's replies use: the defaults with its own sampling fields."""
    return defaults.copy(**{k: v for k, v in sampling.items() if k in SAMPLING_FIELDS})


class Presets:
    """The presets, kept in a store."""

    def __init__(self, store: Store):
        self.store = store

    def all(self) -> dict[str, dict]:
        """Every preset by name: the built-in ones, then the user's."""
        return {**BUILT_IN, **self._saved()}

    def save(self, name: str, values: dict) -> None:
        if name in BUILT_IN:
            raise ValueError(f"“{name}” is a built-in preset; pick another name")
        saved = self._saved()
        saved[name] = {k: values[k] for k in SAMPLING_FIELDS if k in values}
        self.store.set_setting(PRESETS_KEY, saved)

    def delete(self, name: str) -> None:
        saved = self._saved()
        saved.pop(name, None)
        self.store.set_setting(PRESETS_KEY, saved)

    def _saved(self) -> dict[str, dict]:
        return self.store.get_setting(PRESETS_KEY, {}) or {}
