"""Images over HTTP on a tiny vision checkpoint: the openai and anthropic SDKs send them (stream and not) and get what
the engine answers for the same conversation; Responses-style input_image parts; http(s) URLs refused unless
--allow-image-urls, then fetched from a local http.server with size and time limits; and every bad input is a 400 in
the API's own envelope, one line, leaking nothing."""

import base64
import http.server
import io
import threading
import time

import anthropic
import numpy as np
import openai
import pytest
from PIL import Image

from engine.api import SamplingParams
from tests.server_harness import MODEL, make_engine, raw, serving
from tests.test_vision_processor import MODES, bad_input

QUESTION = "What is in the picture?"


def png(w=100, h=70, seed=0) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, kind="image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def openai_parts(url, kind="image_url"):
    image = {"type": kind, "image_url": url if kind == "input_image" else {"url": url}}
    return [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]


def anthropic_parts(data: bytes, media_type="image/png"):
    block = {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                         "data": base64.b64encode(data).decode()}}
    return [{"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def engine(checkpoint):
    e = make_engine(checkpoint("gqa3_ratio3"), max_images=3, max_image_bytes=400_000)
    yield e
    e.close()


@pytest.fixture(scope="module")
def server(engine):
    with serving(engine) as s:
        yield s


@pytest.fixture(scope="module")
def url_server(engine):
    with serving(engine, allow_image_urls=True, image_url_timeout_s=1.0) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def expected(engine, data=None, n=6, ignore_eos=True) -> str:
    """The engine's own greedy reply (thinking off) to the image + question."""
    messages = [{"role": "user", "content": [{"type": "image", "image": data or png()},
                                             {"type": "text", "text": QUESTION}]}]
    return engine.generate(messages, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=ignore_eos),
                           enable_thinking=False).text


def openai_chat(oai, messages, **kw):
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0.0,
                                       reasoning_effort="none", extra_body={"ignore_eos": True}, **kw)


def test_openai_sdk_sends_an_image(engine, oai):
    want = expected(engine)
    reply = openai_chat(oai, openai_parts(data_url(png())))
    assert reply.choices[0].message.content == want
    assert reply.usage.prompt_tokens > 20                    # the image's tokens are counted
    stream = openai_chat(oai, openai_parts(data_url(png())), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want


def test_responses_style_input_image_part(engine, server):
    status, _, body = raw(server, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": openai_parts(data_url(png()), "input_image"), "max_tokens": 6,
        "temperature": 0, "reasoning_effort": "none", "ignore_eos": True})
    assert status == 200, body
    import json
    assert json.loads(body)["choices"][0]["message"]["content"] == expected(engine)


def test_anthropic_sdk_sends_an_image(engine, claude):
    want = expected(engine, ignore_eos=False)          # the Messages API has no ignore_eos
    reply = claude.messages.create(model=MODEL, max_tokens=6, messages=anthropic_parts(png()),
                                   extra_body={"temperature": 0.0})
    assert "".join(b.text for b in reply.content if b.type == "text") == want
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=anthropic_parts(png()),
                                extra_body={"temperature": 0.0}) as stream:
        assert "".join(stream.text_stream) == want
    count = claude.messages.count_tokens(model=MODEL, messages=anthropic_parts(png()))
    assert count.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


@pytest.mark.parametrize("mode", ["cmyk_jpeg", "rgba", "palette_transparent", "webp"])
def test_other_modes_are_answered(oai, mode):
    data = MODES[mode]()
    kind = {"cmyk_jpeg": "image/jpeg", "webp": "image/webp"}.get(mode, "image/png")
    assert openai_chat(oai, openai_parts(data_url(data, kind))).choices[0].finish_reason == "length"


def test_animated_gif_takes_its_first_frame(engine, oai):
    frames = [Image.open(io.BytesIO(png(seed=s))).convert("RGB") for s in (0, 1)]
    gif, first = io.BytesIO(), io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    frames[0].save(first, "GIF")
    reply = openai_chat(oai, openai_parts(data_url(gif.getvalue(), "image/gif")))
    assert reply.choices[0].message.content == expected(engine, first.getvalue())


BAD_OPENAI = {
    "corrupt": (lambda: data_url(bad_input("not_an_image")[0]), "cannot be read"),
    "zero_by_zero": (lambda: data_url(bad_input("zero_by_zero")[0]), "0x0"),
    "bomb": (lambda: data_url(bad_input("bomb_20000")[0]), "pixels"),
    "truncated": (lambda: data_url(bad_input("truncated_png")[0]), "corrupt"),
    "unsupported_type": (lambda: data_url(png(), "image/svg+xml"), "not supported"),
    "pdf_bytes": (lambda: data_url(bad_input("pdf")[0]), "cannot be read"),
    "wrong_base64": (lambda: "data:image/png;base64,@@not*base64@@", "not valid base64"),
    "not_a_data_url": (lambda: "data:image/png,rawbytes", "not base64"),
    "too_big": (lambda: data_url(b"\x89PNG" + bytes(500_000)), "larger than"),
    "http_url_off": (lambda: "http://127.0.0.1:9/x.png", "--allow-image-urls"),
    "file_url": (lambda: "file:///etc/passwd", "data: URL"),
}


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("name", BAD_OPENAI)
def test_bad_openai_images_are_clear_400s(oai, name):
    url, words = BAD_OPENAI[name]
    with pytest.raises(openai.BadRequestError) as info:
        openai_chat(oai, openai_parts(url()))
    err = info.value.body
    assert err["type"] == "invalid_request_error" and words in err["message"], err
    assert "\n" not in err["message"] and "Traceback" not in err["message"] and "/tmp" not in err["message"]
    assert err["param"].startswith("messages")


def test_too_many_images_is_refused_before_decoding(oai, claude):
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] * 4
    with pytest.raises(openai.BadRequestError, match="too many images"):
        openai_chat(oai, [{"role": "user", "content": parts}])
    blocks = anthropic_parts(png())[0]["content"][:1] * 4
    with pytest.raises(anthropic.BadRequestError, match="too many images"):
        claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": blocks}])


def test_bad_anthropic_images_are_clear_400s(claude):
    for data, media_type, words in [(b"garbage" * 10, "image/png", "cannot be read"),
                                    (png(), "image/svg+xml", "not supported"),
                                    (bad_input("zero_by_zero")[0], "image/png", "0x0")]:
        with pytest.raises(anthropic.BadRequestError, match=words) as info:
            claude.messages.create(model=MODEL, max_tokens=2, messages=anthropic_parts(data, media_type))
        assert info.value.body["error"]["type"] == "invalid_request_error"
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="--allow-image-urls"):
        claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [url]}])


def test_a_model_without_vision_says_so(checkpoint):
    e = make_engine(checkpoint("gqa3_ratio3"), vision="off")
    try:
        with serving(e) as s:
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.BadRequestError, match="the loaded model has no vision"):
                openai_chat(client, openai_parts(data_url(png())))
    finally:
        e.close()


class Images(http.server.BaseHTTPRequestHandler):
    """/ok.png: an image; /big.png: more than the limit; /slow.png: answers after the time limit; /text: not an
    image; /redirect: to a file: URL."""

    def do_GET(self):
        if self.path == "/slow.png":
            time.sleep(2.5)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
            return
        if self.path == "/missing.png":
            self.send_error(404)
            return
        body = {"/big.png": b"\x89PNG" + bytes(500_000), "/text": b"hello"}.get(self.path, png())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if self.path == "/text" else "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:              # the server stopped reading at its limit
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_image_urls_when_allowed(engine, url_server, image_host):
    client = openai.OpenAI(base_url=url_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert openai_chat(client, openai_parts(image_host + "/ok.png")).choices[0].message.content == expected(engine)
    claude = anthropic.Anthropic(base_url=url_server.url, api_key="unused", max_retries=0)
    block = {"type": "image", "source": {"type": "url", "url": image_host + "/ok.png"}}
    reply = claude.messages.create(model=MODEL, max_tokens=6, extra_body={"temperature": 0.0},
                                   messages=[{"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}])
    assert "".join(b.text for b in reply.content if b.type == "text") == expected(engine, ignore_eos=False)
    for path, words in [("/big.png", "larger than"), ("/slow.png", "could not be fetched"), ("/text", "not an image"),
                        ("/redirect", "HTTP 302"), ("/missing.png", "HTTP 404")]:
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError, match=words):
            openai_chat(client, openai_parts(image_host + path))
        assert time.monotonic() - started < 2.5
