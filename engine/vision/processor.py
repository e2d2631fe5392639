"""Image bytes -> the vision tower's input, as transformers' Qwen2VLImageProcessor computes it.

decode (Pillow; the first frame of an animation; EXIF orientation applied, as transformers' load_image does)
-> RGB (transparency composited onto white, as transformers' convert_to_rgb does for a Pillow image)
-> resize (Pillow bicubic) to multiples of patch x merge within the checkpoint's min / max pixels
-> rescale to [0, 1] and normalise -> patchify: one row of C x T x P x P values per patch, patches in merge-block
order (each 2 x 2 block of patches consecutive), a still image repeated over the temporal patch.

The numbers equal transformers' PIL backend (`Qwen2VLImageProcessorPil`, what AutoImageProcessor gives without
torchvision). Its torchvision backend (the default where torchvision is installed) resizes with torch's antialiased
bicubic instead: on the CPU (uint8) up to 2 levels of 255 on about 1% of the resized pixels, on a GPU (float) up to 13
levels where a tiny image is enlarged (measured on the test sizes). One deliberate difference: 16-bit grayscale is
scaled to 8 bits, where Pillow's conversion (and so transformers) clips it at 255.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")   # Pillow's JPEG opener also reads cameras' MPO
FORMAT_NAMES = "PNG, JPEG, GIF, WebP, BMP or TIFF"
# decompression-bomb limit: Pillow's warning threshold, 89 megapixels (its default, where another import set None)
MAX_DECODED_PIXELS: int = Image.MAX_IMAGE_PIXELS or 89_478_485
MAX_ASPECT_RATIO = 200                 # transformers' smart_resize refuses more


class ImageInputError(ValueError):
    """An image the engine cannot take; the message is one line, fit for the user."""


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The checkpoint's preprocessor_config.json (the processor class's defaults differ: always read the file)."""
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    resample: int = 3                     # Pillow's BICUBIC

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this."""
        return self.patch_size * self.merge_size


def load_processor_config(path: str | Path) -> ImageProcessorConfig:
    """From preprocessor_config.json, or the `image_processor` entry of processor_config.json (both are shipped)."""
    path = Path(path)
    if (path / "preprocessor_config.json").is_file():
        raw = json.loads((path / "preprocessor_config.json").read_text(encoding="utf-8"))
    elif (path / "processor_config.json").is_file():
        raw = json.loads((path / "processor_config.json").read_text(encoding="utf-8")).get("image_processor") or {}
    else:
        raise FileNotFoundError(f"{path} has no preprocessor_config.json: its images cannot be prepared")
    return parse_processor_config(raw)


def parse_processor_config(raw: dict) -> ImageProcessorConfig:
    """Keys as transformers reads them: size.shortest_edge / longest_edge, overridden by min_pixels / max_pixels."""
    size = raw.get("size") or {}
    missing = [k for k in ("patch_size", "image_mean", "image_std") if k not in raw]
    if missing or not (raw.get("min_pixels") or size.get("shortest_edge")):
        raise ValueError(f"preprocessor_config.json lacks {', '.join(missing) or 'size'}")
    return ImageProcessorConfig(
        min_pixels=int(raw.get("min_pixels") or size["shortest_edge"]),
        max_pixels=int(raw.get("max_pixels") or size["longest_edge"]),
        patch_size=int(raw["patch_size"]),
        temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
        merge_size=int(raw.get("merge_size", 2)),
        image_mean=tuple(float(m) for m in raw["image_mean"]),
        image_std=tuple(float(s) for s in raw["image_std"]),
        rescale_factor=float(raw.get("rescale_factor", 1 / 255)),
        resample=int(raw.get("resample", 3)),
    )


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: torch.Tensor    # [t * h * w, C * T * P * P] float32, patches in merge-block order
    grid: tuple[int, int, int]    # (t, h, w) in patches
    num_tokens: int               # merged patches: the image's placeholder tokens in the prompt
    digest: bytes                 # identifies the pixels: the prefix cache hashes the image's tokens by it


def decode_image(data: bytes) -> Image.Image:
    """Bytes -> an RGB Pillow image; ImageInputError (one line) for anything else."""
    if not data:
        raise ImageInputError("the image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise ImageInputError(f"the image cannot be read: not {FORMAT_NAMES}, or a broken header (0x0 pixels, "
                              "say)") from None
    except Image.DecompressionBombError:
        raise ImageInputError(f"the image has too many pixels (limit {_megapixels(MAX_DECODED_PIXELS)})") from None
    except Exception:  # a header Pillow cannot parse: any error here is a bad upload, never the server's
        raise ImageInputError("the image data is corrupt") from None
    width, height = image.size
    if width == 0 or height == 0:
        raise ImageInputError(f"the image is {width}x{height} pixels")
    if width * height > MAX_DECODED_PIXELS:
        raise ImageInputError(f"the image is {width}x{height} ({_megapixels(width * height)}), above the "
                              f"{_megapixels(MAX_DECODED_PIXELS)} limit")
    if image.mode == "F":
        raise ImageInputError("32-bit floating-point images are not supported")
    try:
        image.load()                     # the first frame of an animation
        return to_rgb(ImageOps.exif_transpose(image))
    except Exception:
        raise ImageInputError("the image data is corrupt or truncated") from None


def _megapixels(n: int) -> str:
    return f"{n / 1e6:.0f} megapixels"


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' convert_to_rgb for a Pillow image (alpha or a transparent colour composited onto white), after
    scaling 16-bit grayscale to 8 bits."""
    if image.mode == "I" or image.mode.startswith("I;16"):
        gray = np.asarray(image).astype(np.float64)
        image = Image.fromarray(np.clip(np.round(gray / 257), 0, 255).astype(np.uint8), "L")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' smart_resize: sides multiples of factor, pixels within [min, max], aspect ratio kept closely."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageInputError(f"the image is {width}x{height}: an aspect ratio above {MAX_ASPECT_RATIO}:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess(image: Image.Image, cfg: ImageProcessorConfig) -> ProcessedImage:
    """An RGB image -> pixel values and grid (t = 1: a still image)."""
    height, width = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(image.resize((width, height), resample=cfg.resample))             # [H, W, 3] uint8
    x = (resized.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    x = (x - np.array(cfg.image_mean, dtype=np.float32)) / np.array(cfg.image_std, dtype=np.float32)
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    x = x.transpose(2, 0, 1).reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p)).reshape(gh * gw, 3 * t * p * p)
    return ProcessedImage(pixel_values=torch.from_numpy(np.ascontiguousarray(x)), grid=(1, gh, gw),
                          num_tokens=gh * gw // (m * m), digest=_digest(resized, cfg))


def _digest(resized: np.ndarray, cfg: ImageProcessorConfig) -> bytes:
    """blake2b of the resized 8-bit pixels and the processing that turns them into pixel values (the same identity as
    the pixel values, at a sixth of the bytes to hash)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((resized.shape, cfg)).encode())
    h.update(np.ascontiguousarray(resized).tobytes())
    return h.digest()


def process_image(data: bytes, cfg: ImageProcessorConfig) -> ProcessedImage:
    """Image file bytes -> the tower's input; ImageInputError for a bad image."""
    return preprocess(decode_image(data), cfg)
