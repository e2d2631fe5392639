"""Tokenizer: a checkpoint's tokenizer.json (Hugging Face `tokenizers`) plus the ids it stops on.

Encoding matches transformers' fast tokenizer for the same files: no BOS is added, and the
text of an added token (`<|im_start|>`, `<think>`, ...) maps to that token's id.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from engine.text.detokenizer import StreamDetokenizer


class Tokenizer:
    def __init__(self, backend: tokenizers.Tokenizer, eos_token_ids: tuple[int, ...] = ()):
        self.backend = backend
        self.eos_token_ids = eos_token_ids
        self.special_ids = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
        # the reasoning tags (None in a vocabulary without them)
        self.think_start_id = backend.token_to_id("<think>")
        self.think_end_id = backend.token_to_id("</think>")

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Tokenizer:
        """Read tokenizer.json, tokenizer_config.json, generation_config.json and config.json."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}: not a Hugging Face checkpoint directory")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the library reports bad JSON and unknown components alike
            raise ValueError(f"cannot read {file}: {e}") from None
        config = read_json(path / "tokenizer_config.json")
        _add_config_tokens(backend, config)
        return cls(backend, _eos_token_ids(path, backend, config))

    def encode(self, text: str) -> list[int]:
        if len(text) < 4096:
            return self.backend.encode(text, add_special_tokens=False).ids
        # encode_batch lets go of the GIL while it works (encode holds it): a long text does not stop other threads
        return self.backend.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (the model's embedding may have more rows)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def detokenizer(self, skip_special_tokens: bool = False) -> StreamDetokenizer:
        return StreamDetokenizer(self.decode, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)


def read_json(file: Path) -> dict:
    """A checkpoint's optional JSON file ({} when absent); a clear error when unreadable."""
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {file}: {e}") from None


def _add_config_tokens(backend: tokenizers.Tokenizer, config: dict) -> None:
    """Add the tokens tokenizer_config.json declares but tokenizer.json lacks, as transformers
    does (some checkpoints list their audio/tts controls only in the config)."""
    declared = sorted((int(i), t) for i, t in (config.get("added_tokens_decoder") or {}).items())
    for token_id, token in declared:
        if backend.token_to_id(token["content"]) is not None:
            continue
        backend.add_tokens([tokenizers.AddedToken(
            token["content"], special=token.get("special", False), normalized=token.get("normalized", False),
            lstrip=token.get("lstrip", False), rstrip=token.get("rstrip", False),
            single_word=token.get("single_word", False),
        )])
        if backend.token_to_id(token["content"]) != token_id:
            raise ValueError(f"tokenizer_config.json puts {token['content']!r} at id {token_id}, "
                             f"which does not follow tokenizer.json's vocabulary")


def _eos_token_ids(path: Path, backend: tokenizers.Tokenizer, config: dict) -> tuple[int, ...]:
    """Union, in this order, of generation_config.json's eos_token_id, config.json's (top level or
    text_config) and tokenizer_config.json's eos_token."""
    generation = read_json(path / "generation_config.json")
    model = read_json(path / "config.json")
    found = [generation.get("eos_token_id"), model.get("eos_token_id"),
             (model.get("text_config") or {}).get("eos_token_id")]
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str):
        found.append(backend.token_to_id(eos))
    ids: list = []
    for value in found:
        ids += value if isinstance(value, list) else [value]
    return tuple(dict.fromkeys(i for i in ids if isinstance(i, int)))


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies (Qwen's) are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
