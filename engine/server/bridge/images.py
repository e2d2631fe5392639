"""Image parts of API requests -> the engine's image parts {"type": "image", "image": <file bytes>}.

Sources: data: URLs (OpenAI image_url / input_image), base64 blocks (Anthropic), and http(s) URLs only when the
server was started with --allow-image-urls (a local server fetching any address a web page names would reach the
user's own network): then fetched in the request's worker thread with a size and a time limit. The request's count
and each image's encoded size are checked before anything is decoded; the engine then reads the pixels
(Engine.process_images) and refuses a bad image with a one-line message. Every refusal is a 400 naming the part.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from engine.api import NO_VISION
from engine.server.http.errors import APIError

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/tiff")
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*);base64,(.*)", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ImageOptions:
    """What a request's images may be (the engine's limits, the server's URL setting)."""
    vision: bool                   # the loaded engine takes images
    max_images: int
    max_bytes: int                 # encoded bytes per image
    allow_urls: bool = False
    url_timeout_s: float = 10.0


class ImageParts:
    """Collects one request's image parts in order, checking the limits as they come."""

    def __init__(self, options: ImageOptions):
        self.options, self.count = options, 0

    def _next(self, where: str) -> None:
        if not self.options.vision:
            raise APIError(400, NO_VISION, param=where)
        self.count += 1
        if self.count > self.options.max_images:
            raise APIError(400, f"too many images: at most {self.options.max_images} per request", param=where)

    def from_url(self, url, where: str) -> dict:
        """An OpenAI image_url ({"url": ...} or the URL itself, as Responses' input_image gives it)."""
        self._next(where)
        if isinstance(url, dict):
            url = url.get("url")
        if not isinstance(url, str) or not url:
            raise APIError(400, "an image part needs image_url.url (a data: URL, or http(s) where allowed)",
                           param=where)
        if url[:5].lower() == "data:":
            match = _DATA_URL.fullmatch(url.strip())
            if match is None:
                raise APIError(400, "the image's data: URL is not base64 (data:image/png;base64,...)", param=where)
            return self._base64(match.group(3), match.group(1), where)
        if url[:7].lower() == "http://" or url[:8].lower() == "https://":
            if not self.options.allow_urls:
                raise APIError(400, "image URLs are off on this server (start it with --allow-image-urls); send the "
                                    "image as a data: URL", param=where)
            return {"type": "image", "url": url, "where": where}
        raise APIError(400, "an image URL must be a data: URL (or http(s) where allowed)", param=where)

    def from_source(self, source: dict | None, where: str) -> dict:
        """An Anthropic image block's source: base64 (media_type + data), or url where allowed."""
        self._next(where)
        source = source or {}
        if source.get("type") == "base64":
            return self._base64(source.get("data"), source.get("media_type"), where)
        if source.get("type") == "url":
            self.count -= 1
            return self.from_url(source.get("url"), where)
        raise APIError(400, "an image block's source must be base64 (or url where allowed)", param=where)

    def _base64(self, data, media_type: str | None, where: str) -> dict:
        if media_type is not None and media_type.lower() not in MEDIA_TYPES:
            raise APIError(400, f"image type {media_type!r} is not supported ({', '.join(MEDIA_TYPES)})", param=where)
        if not isinstance(data, str):
            raise APIError(400, "the image has no base64 data", param=where)
        data = re.sub(r"\s+", "", data)
        if len(data) // 4 * 3 > self.options.max_bytes + 2:
            raise APIError(400, f"the image is larger than {_mib(self.options.max_bytes)}", param=where)
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, "the image's base64 data is not valid base64", param=where) from None
        if not raw:
            raise APIError(400, "the image is empty", param=where)
        return {"type": "image", "image": raw}


def fetch_images(messages: list[dict], options: ImageOptions) -> list[dict]:
    """Messages whose URL image parts (ImageParts.from_url with URLs allowed) are fetched into bytes. Blocking: run in
    the request's worker thread."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(p.get("url") for p in content if isinstance(p, dict)):
            m = {**m, "content": [fetch(p["url"], options, p["where"]) if isinstance(p, dict) and p.get("url")
                                  else p for p in content]}
        out.append(m)
    return out


def fetch(url: str, options: ImageOptions, where: str) -> dict:
    """GET url with the time limit, reading at most max_bytes; any failure is a 400 that names the part only."""
    request = urllib.request.Request(url, headers={"User-Agent": "qwendesk", "Accept": ", ".join(MEDIA_TYPES)})
    try:
        with _OPENER.open(request, timeout=options.url_timeout_s) as response:
            kind = response.headers.get_content_type()
            if kind not in MEDIA_TYPES:
                raise APIError(400, f"the image URL answered with {kind!r}, not an image type", param=where)
            data = response.read(options.max_bytes + 1)
    except APIError:
        raise
    except urllib.error.HTTPError as e:
        raise APIError(400, f"the image URL answered HTTP {e.code}", param=where) from None
    except (urllib.error.URLError, OSError, ValueError):   # refused, unknown host, timeout, bad URL
        raise APIError(400, "the image URL could not be fetched (unreachable, too slow or not a valid URL)",
                       param=where) from None
    if len(data) > options.max_bytes:
        raise APIError(400, f"the image at the URL is larger than {_mib(options.max_bytes)}", param=where)
    return {"type": "image", "image": data}


# urllib's default opener: redirects only to http(s), ftp (refused as HTTP errors otherwise); proxies from the
# environment, as any client on the machine.
_OPENER = urllib.request.build_opener()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
