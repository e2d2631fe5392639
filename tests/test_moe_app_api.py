"""A tiny qwen3_5_moe checkpoint (the multimodal wrapper: vision tower, MTP layer, experts stored one by one) through
the endpoint and the app, on the real engine (CPU): text and an image, streamed and not, with speculative rounds of
its MoE MTP layer, and two clients at once."""

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QUrl

from engine.api import SamplingParams
from tests.app_support import seeded_replies, send, wait_reply
from tests.server_harness import MODEL, make_engine, serving
from tests.test_app_chat import assistant_messages, loaded_window

SPEC = "moe_wrapper_ties"


def png(seed=0, w=128, h=96) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def image_message(data: bytes, text: str, url: bool):
    image = ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}
             if url else {"type": "image", "image": data})
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def engine(checkpoint):
    e = make_engine(checkpoint(SPEC), profile="C2", speculative_tokens=3)
    yield e
    e.close()


@pytest.fixture(scope="module")
def oai(engine):
    with serving(engine) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def alone(engine, messages, n=8) -> str:
    return engine.generate(messages, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                           enable_thinking=False).text


def chat(oai, messages, **kw):
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0.0,
                                       reasoning_effort="none", extra_body={"ignore_eos": True}, **kw)


def test_the_endpoint_serves_the_moe_model_text_and_image(engine, oai):
    assert engine.model_config.is_moe and engine.accepts_images and engine._model.mtp is not None
    text = [{"role": "user", "content": "Which experts answer this?"}]
    reply = chat(oai, text)
    assert reply.choices[0].message.content == alone(engine, text)
    stream = chat(oai, text, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == alone(engine, text)
    encoded, question = engine.stats()["images_encoded"], "What is in the picture?"
    pictured = chat(oai, image_message(png(), question, url=True))
    assert pictured.choices[0].message.content == alone(engine, image_message(png(), question, url=False))
    text_only = len(engine.encode_prompt([{"role": "user", "content": question}], enable_thinking=False))
    assert pictured.usage.prompt_tokens >= text_only + 12                      # the image's 4 x 3 merged patches
    assert engine.stats()["images_encoded"] > encoded      # (the second time from the prefix cache)
    assert engine.stats()["spec_rounds"] > 0                                   # the MoE MTP layer drafted


def test_two_clients_at_once_get_what_each_gets_alone(engine, oai):
    prompts = [[{"role": "user", "content": f"Question number {i}, a little longer than the other" * (1 + i)}]
               for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda m: chat(oai, m).choices[0].message.content, prompts))
    assert replies == [alone(engine, m) for m in prompts]


def test_the_app_chats_with_the_moe_model_and_sends_it_an_image(app_env, qtbot, checkpoint, monkeypatch, tmp_path):
    seeded_replies(monkeypatch)
    window = loaded_window(app_env, qtbot, checkpoint(SPEC), max_tokens=10)
    engine = window.engine._engine
    assert engine.model_config.is_moe and window.engine.supports_vision
    send(qtbot, window, "Hello, experts")
    wait_reply(qtbot, window)
    path = tmp_path / "photo.png"
    path.write_bytes(png(1))
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(path))])
    window.chat.composer.input.insertFromMimeData(drop)
    send(qtbot, window, "And this picture?")
    wait_reply(qtbot, window)
    first, second = assistant_messages(window)
    assert first.status == second.status == "complete" and first.content and second.content
    assert engine.stats()["images_encoded"] == 1
    assert second.metrics["prompt_tokens"] > first.metrics["prompt_tokens"] + first.metrics["output_tokens"] + 4
