"""Token logprobs in OpenAI's two shapes, with each token's exact bytes.

Qwen's tokenizer is byte-level BPE: a vocabulary entry spells its bytes with one printable character
per byte (the GPT-2 alphabet), so a token that holds half of a UTF-8 character still has exact
bytes, even though its text alone is not valid UTF-8.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from engine.api import TokenLogprob
from engine.server.http.errors import APIError

MAX_SCORED_PROMPT = 1024    # prompt tokens whose logprobs a request may ask for (the engine scores all rows at once:
#                             a row of logits per token, ~1 MB each at Qwen's vocabulary)


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
    def entry(token_id: int, logprob: float | None) -> dict:
        return {"token": tb.text(token_id), "logprob": logprob, "bytes": list(tb.bytes(token_id))}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in items], "refusal": None}


def completion_logprobs(items: list[TokenLogprob], tb: TokenBytes, offset: int = 0) -> dict:
    """The legacy shape: parallel lists, with each token's character offset in the choice's text. A prompt's first
    token (echo) has no logprob: null, as OpenAI writes it."""
    tokens, offsets = [], []
    for lp in items:
        offsets.append(offset)
        tokens.append(tb.text(lp.token_id))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [None if lp.logprob is None else {tb.text(t): v for t, v in lp.top} for lp in items],
            "text_offset": offsets}


def prompt_logprobs(engine, ids: list[int], top: int) -> list[TokenLogprob]:
    """Each prompt token's logprob given the tokens before it, and the `top` most likely there (the first token has
    none). Runs Engine.score: on the Workers, it waits for the engine's thread."""
    if len(ids) > MAX_SCORED_PROMPT:
        raise APIError(400, f"prompt logprobs (echo with logprobs) are served for prompts of up to {MAX_SCORED_PROMPT} "
                            f"tokens; this one has {len(ids)}", param="echo")
    try:
        logits = engine.score(ids)
    except RuntimeError as e:       # no cache room now, or the engine closed
        raise APIError(503, f"cannot score the prompt now: {e}", "unavailable", headers={"retry-after": "1"}) from None
    logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    best = torch.topk(logprobs, top, dim=-1) if top else None
    items = [TokenLogprob(ids[0], None, [])]
    for i, token in enumerate(ids[1:]):
        alts = list(zip(best.indices[i].tolist(), best.values[i].tolist())) if best is not None else []
        items.append(TokenLogprob(token, chosen[i], alts))
    return items
