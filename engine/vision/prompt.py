"""A prompt's images as the engine carries them: the image parts taken out of chat messages, and the expanded prompt
with what the scheduler and the runner need of its images (token spans, 3-axis positions, prefix-cache tokens)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.vision.positions import MRopePositions, mrope_positions
from engine.vision.processor import ImageInputError, ProcessedImage
from engine.vision.tokens import image_hash_tokens


def split_images(messages: list) -> tuple[list, list[bytes]]:
    """Chat messages whose list contents may hold image parts {"type": "image", "image": <encoded file bytes>} -> the
    same messages with each such part as {"type": "image"} (what the template needs to write its placeholder), and
    the images' bytes in the order the template meets them."""
    out, images = [], []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image":
                data = part.get("image")
                if not isinstance(data, (bytes, bytearray)):
                    raise ImageInputError("an image part must carry the image file's bytes under 'image'")
                images.append(bytes(data))
                part = {"type": "image"}
            parts.append(part)
        out.append({**message, "content": parts})
    return out, images


@dataclass(frozen=True)
class ImagePrompt:
    """An expanded prompt's images: spans[i] = (first, end) token rows of image i; mrope: the prompt's positions;
    hash_tokens: the prompt with each image's run replaced by its digest (the prefix cache's page hashes)."""
    images: tuple[ProcessedImage, ...]
    spans: tuple[tuple[int, int], ...]
    mrope: MRopePositions
    hash_tokens: list[int]


def image_prompt(ids: list[int], images: list[ProcessedImage], image_token_id: int, merge: int) -> ImagePrompt:
    """For token ids already expanded (expand_image_placeholders): check them against the images and derive the
    rest. Raises ImageInputError when the placeholder runs do not match the images."""
    positions = mrope_positions(ids, image_token_id, [i.grid for i in images], merge)
    spans, start = [], 0
    for image in images:
        start = ids.index(image_token_id, start)
        spans.append((start, start + image.num_tokens))
        start += image.num_tokens
    return ImagePrompt(tuple(images), tuple(spans), positions, image_hash_tokens(ids, image_token_id, images))

