"""Token logprobs in OpenAI's two shapes, with each token's exact bytes.

Qwen's tokenizer is byte-level BPE: a vocabulary entry spells its bytes with one printable character
per byte (the GPT-2 alphabet), so a token that holds half of a UTF-8 character still has exact
bytes, even though its text alone is not valid UTF-8.
"""

from __future__ import annotations

from functools import lru_cache

from engine.api import TokenLogprob


def _byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for
    the code points from 256 up, in byte order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


ALPHABET = _byte_alphabet()


class TokenBytes:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.backend.decoder).__name__ == "ByteLevel"
        self.added = frozenset(tokenizer.backend.get_added_tokens_decoder())   # spelt as plain text
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self.byte_level and token_id not in self.added and all(ch in ALPHABET for ch in piece):
            return bytes(ALPHABET[ch] for ch in piece)
        return self.tokenizer.decode([token_id]).encode()

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def chat_logprobs(items: list[TokenLogprob], tb: TokenBytes) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        return {"token": tb.text(token_id), "logprob": logprob, "bytes": list(tb.bytes(token_id))}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in items], "refusal": None}


def completion_logprobs(items: list[TokenLogprob], tb: TokenBytes, offset: int = 0) -> dict:
    """The legacy shape: parallel lists, with each token's character offset in the choice's text."""
    tokens, offsets = [], []
    for lp in items:
        offsets.append(offset)
        tokens.append(tb.text(lp.token_id))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{tb.text(t): v for t, v in lp.top} for lp in items], "text_offset": offsets}
