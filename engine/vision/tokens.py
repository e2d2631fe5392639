"""Image placeholder tokens in a prompt: expansion, the rows a prefill step scatters image embeddings into, and the
values the prefix cache hashes in their place.

The chat template writes `<|vision_start|><|image_pad|><|vision_end|>` for each image; the model reads one
`<|image_pad|>` per merged patch, each taking one row of the tower's output for that image.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.vision.processor import ImageInputError, ProcessedImage


def expand_image_placeholders(tokens: list[int], image_token_id: int, images: Sequence[ProcessedImage]) -> list[int]:
    """Each image token (one per image, in order) repeated to the image's merged patch count."""
    found = tokens.count(image_token_id)
    if found != len(images):
        raise ImageInputError(f"the prompt has {found} image placeholder(s) for {len(images)} image(s)")
    out, k = [], 0
    for token in tokens:
        if token == image_token_id:
            out += [token] * images[k].num_tokens
            k += 1
        else:
            out.append(token)
    return out


def image_rows(tokens: list[int], image_token_id: int, start: int, end: int) -> tuple[list[int], list[int]]:
    """For a step computing tokens[start:end] of an expanded prompt: the step's rows (0 = start) holding image tokens,
    and for each the index of its embedding among all the prompt's image tokens (the tower's outputs for the
    prompt's images, concatenated in order)."""
    before = tokens[:start].count(image_token_id)
    rows = [i - start for i in range(start, end) if tokens[i] == image_token_id]
    return rows, list(range(before, before + len(rows)))


def image_hash_tokens(tokens: list[int], image_token_id: int, images: Sequence[ProcessedImage]) -> list[int]:
    """The tokens with each image's run replaced by a negative value drawn from its digest (token ids are >= 0), for
    the prefix cache's chained page hashes: the same image in the next turn hits, another one of the same size
    misses, and so does every page after it."""
    out, i, k = list(tokens), 0, 0
    while i < len(out):
        if out[i] != image_token_id:
            i += 1
            continue
        image = images[k]
        out[i:i + image.num_tokens] = [-1 - (int.from_bytes(image.digest[:8], "little") >> 1)] * image.num_tokens
        i, k = i + image.num_tokens, k + 1
    return out
