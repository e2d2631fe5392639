"""engine.vision.processor against transformers' image processor for Qwen3.5 (AutoImageProcessor with Qwen3.5's
own preprocessor_config.json), and the one-line errors for bad images."""

import io
import json
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as transformers_smart_resize

from engine.vision.processor import (ImageInputError, load_processor_config, parse_processor_config, process_image,
                                     smart_resize)
from tests.fixtures.checkpoints import QWEN3_5_PREPROCESSOR

CFG = parse_processor_config(QWEN3_5_PREPROCESSOR)


# the same with max_pixels at 1024², so that pixel values above the limit stay small enough to compare quickly
SMALL_MAX = {**QWEN3_5_PREPROCESSOR, "size": {"longest_edge": 1024 * 1024, "shortest_edge": 65536}}


def transformers_processor(tmp_path_factory, config):
    """transformers' processor as AutoImageProcessor builds it from a checkpoint's file (without torchvision:
    Qwen2VLImageProcessorPil)."""
    d = tmp_path_factory.mktemp("processor")
    (d / "preprocessor_config.json").write_text(json.dumps(config))
    processor = AutoImageProcessor.from_pretrained(d)
    assert type(processor).__name__ == "Qwen2VLImageProcessorPil"

    def run(image: Image.Image):
        out = processor(images=[image], return_tensors="pt")
        return out["pixel_values"], tuple(out["image_grid_thw"][0].tolist())

    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return transformers_processor(tmp_path_factory, QWEN3_5_PREPROCESSOR)


def picture(width, height, seed=0, channels=3):
    """Noise over a gradient (uint8): every resampling tap matters."""
    ramp = (np.arange(width)[None, :] + np.arange(height)[:, None]) * (160 / max(width + height - 2, 1))
    noise = np.random.default_rng(seed).integers(0, 96, (height, width, channels), dtype=np.uint8)
    return ramp.astype(np.uint8)[..., None] + noise


def encode(image: Image.Image, fmt="PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def assert_same(ours, ref):
    pixel_values, grid = ref
    assert ours.grid == grid
    assert ours.pixel_values.dtype == torch.float32 and torch.equal(ours.pixel_values, pixel_values)
    assert ours.num_tokens == grid[0] * grid[1] * grid[2] // 4


SIZES = [(1, 1), (2, 3), (15, 17), (31, 33), (64, 48), (100, 100), (200, 150), (255, 257), (256, 256), (300, 200),
         (333, 1001), (640, 480), (800, 600), (1001, 333), (1024, 1024), (1280, 720), (3, 500), (600, 4), (4000, 20),
         (1920, 1080), (2048, 3072)]
LARGE = [(4200, 4100), (6000, 3000), (10000, 7000), (4097, 4095), (16000, 80)]   # above Qwen3.5's max_pixels


@pytest.mark.parametrize("width,height", SIZES)
def test_sizes_match_transformers(reference, width, height):
    data = encode(Image.fromarray(picture(width, height, seed=width)), "BMP")
    assert_same(process_image(data, CFG), reference(Image.open(io.BytesIO(data))))


@pytest.mark.parametrize("width,height", [(1500, 1000), (1030, 1030), (2500, 400)])
def test_above_max_pixels_matches_transformers(tmp_path_factory, width, height):
    data = encode(Image.fromarray(picture(width, height, seed=width)), "BMP")
    ref = transformers_processor(tmp_path_factory, SMALL_MAX)(Image.open(io.BytesIO(data)))
    assert_same(process_image(data, parse_processor_config(SMALL_MAX)), ref)


def test_grids_match_transformers_at_the_real_limits():
    """Grids (without pixels: 16 megapixels of pixel values take 400 MB) of every size, large ones included."""
    for width, height in SIZES + LARGE:
        ours = smart_resize(height, width, CFG.factor, CFG.min_pixels, CFG.max_pixels)
        assert ours == transformers_smart_resize(height, width, 32, CFG.min_pixels, CFG.max_pixels)
        assert ours[0] % 32 == 0 and ours[1] % 32 == 0 and CFG.min_pixels <= ours[0] * ours[1] <= CFG.max_pixels


def rgba(width=300, height=200):
    pixels = picture(width, height, channels=4)
    pixels[:50, :, 3] = 0                       # fully transparent rows: composited onto white
    return Image.fromarray(pixels, "RGBA")


def paletted_with_transparency():
    image = Image.fromarray(picture(120, 90)).convert("P", palette=Image.Palette.ADAPTIVE)
    return encode(image, transparency=3)


MODES = {
    "rgb_jpeg": lambda: encode(Image.fromarray(picture(640, 480)), "JPEG", quality=90),
    "rgba": lambda: encode(rgba()),
    "la": lambda: encode(rgba().convert("LA")),
    "l": lambda: encode(Image.fromarray(picture(333, 250, channels=1)[..., 0], "L")),
    "one_bit": lambda: encode(Image.fromarray(picture(200, 200, channels=1)[..., 0], "L").convert("1")),
    "palette": lambda: encode(Image.fromarray(picture(120, 90)).convert("P", palette=Image.Palette.ADAPTIVE)),
    "palette_transparent": paletted_with_transparency,
    "cmyk_jpeg": lambda: encode(Image.fromarray(picture(300, 260, channels=4), "CMYK"), "JPEG"),
    "webp": lambda: encode(Image.fromarray(picture(300, 200)), "WEBP", lossless=True),
    "bmp": lambda: encode(Image.fromarray(picture(90, 70)), "BMP"),
    "tiff": lambda: encode(Image.fromarray(picture(90, 70)), "TIFF"),
}


@pytest.mark.parametrize("mode", MODES)
def test_modes_match_transformers(reference, mode):
    data = MODES[mode]()
    assert_same(process_image(data, CFG), reference(Image.open(io.BytesIO(data))))


def png(width, height, bit_depth, color_type, raw=b"") -> bytes:
    """A PNG written by hand: 16-bit colour (which Pillow reads but does not write) and broken headers."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_16_bit_rgb_matches_transformers(reference):
    pixels = picture(150, 100).astype(np.uint16) * 257 + 100
    raw = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in pixels)
    data = png(150, 100, 16, 2, raw)
    assert_same(process_image(data, CFG), reference(Image.open(io.BytesIO(data))))


def test_16_bit_gray_is_scaled_not_clipped(reference):
    """Pillow converts 16-bit grayscale to RGB by clipping at 255 (so transformers sees a white picture); it is
    scaled here, equal to the same picture saved with 8 bits."""
    gray = picture(200, 150, channels=1)[..., 0]
    data16 = encode(Image.fromarray(gray.astype(np.uint16) * 257))
    assert Image.open(io.BytesIO(data16)).mode.startswith("I;16")
    ours = process_image(data16, CFG)
    assert_same(ours, reference(Image.fromarray(gray, "L")))
    assert ours.digest == process_image(encode(Image.fromarray(gray, "L")), CFG).digest


def test_animated_gif_takes_the_first_frame(reference):
    frames = [Image.fromarray(picture(160, 120, seed=s)).convert("P") for s in range(3)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    ours = process_image(data, CFG)
    assert_same(ours, reference(Image.open(io.BytesIO(data))))
    second = Image.open(io.BytesIO(data))
    second.seek(1)
    assert not torch.equal(ours.pixel_values, reference(second.convert("RGB"))[0])


def test_exif_orientation_is_applied(reference):
    exif = Image.Exif()
    exif[0x0112] = 6                            # stored sideways: rotate 90 degrees clockwise to view
    data = encode(Image.fromarray(picture(320, 200)), "JPEG", exif=exif)
    ours = process_image(data, CFG)
    assert_same(ours, reference(ImageOps.exif_transpose(Image.open(io.BytesIO(data)))))
    assert ours.grid[1] > ours.grid[2]          # now taller than wide


def test_digest_tells_images_apart():
    a = process_image(encode(Image.fromarray(picture(300, 200, seed=1))), CFG)
    b = process_image(encode(Image.fromarray(picture(300, 200, seed=2))), CFG)
    again = process_image(encode(Image.fromarray(picture(300, 200, seed=1)), "WEBP", lossless=True), CFG)
    assert a.grid == b.grid and a.digest != b.digest
    assert a.digest == again.digest             # the same pixels in another file format


BAD = {
    "empty": (b"", "empty"),
    "not_an_image": (b"hello, this is text and not a picture at all" * 4, "cannot be read"),
    "pdf": (b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF", "cannot be read"),
    "eps": (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "cannot be read"),   # no Ghostscript call
    "zero_by_zero": (png(0, 0, 8, 2), "0x0"),
    "bomb_20000": (png(20000, 20000, 8, 0, b"\x00" * 64), "pixels"),
    "over_the_limit": (png(10000, 9000, 8, 0, b"\x00" * 64), "90 megapixels"),
    "truncated_png": (None, "corrupt"),
    "bad_pixels": (png(64, 64, 8, 2, b"\x07" * 50), "corrupt"),
    "aspect_ratio": (None, "aspect ratio"),
    "float_tiff": (None, "floating-point"),
}


def bad_input(name):
    data, words = BAD[name]
    if name == "truncated_png":
        data = encode(Image.fromarray(picture(300, 200)))[:900]
    elif name == "aspect_ratio":
        data = encode(Image.fromarray(picture(1000, 4)))
    elif name == "float_tiff":
        data = encode(Image.fromarray(np.random.default_rng(0).random((20, 30), dtype=np.float32), "F"), "TIFF")
    return data, words


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")   # Pillow's, above 89 megapixels
@pytest.mark.parametrize("name", BAD)
def test_bad_images_raise_one_line_errors(name):
    data, words = bad_input(name)
    with pytest.raises(ImageInputError) as info:
        process_image(data, CFG)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and words in message
    assert "\n" not in message and len(message) < 200 and "BytesIO" not in message


def test_processor_config_from_the_checkpoint(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(QWEN3_5_PREPROCESSOR))
    cfg = load_processor_config(tmp_path)
    assert (cfg.min_pixels, cfg.max_pixels, cfg.image_mean, cfg.patch_size, cfg.factor) == \
        (65536, 16777216, (0.5, 0.5, 0.5), 16, 32)
    (tmp_path / "preprocessor_config.json").unlink()
    nested = {"image_processor": {**QWEN3_5_PREPROCESSOR, "min_pixels": 4096}}   # min_pixels wins over size
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    assert load_processor_config(tmp_path).min_pixels == 4096
    (tmp_path / "processor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        load_processor_config(tmp_path)
