"""Images through the whole engine (CPU, fp32, tiny random vision checkpoints): chat messages with image parts give
transformers' Qwen3_5ForConditionalGeneration greedy continuation (one image, several, an image in an earlier turn);
the prefix cache hits on the same image (also inside one: its rows are encoded again) and misses on another of the
same size; batched with text-only requests equals alone; speculative rounds equal plain greedy; bad images and limits
are one-line ImageInputErrors."""

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration

from engine.api import Engine, EngineConfig, ImageInputError, SamplingParams, split_images
from engine.bench.oracle import DraftOracle

GREEDY = dict(temperature=0.0, ignore_eos=True)


def png(w, h, seed=0, mode="RGB") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, len(mode)), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode).save(out, "PNG")
    return out.getvalue()


def image(data):
    return {"type": "image", "image": data}


def text(t):
    return {"type": "text", "text": t}


ONE = [{"role": "user", "content": [image(png(100, 70)), text("What is in the picture?")]}]
SEVERAL = [
    {"role": "user", "content": [text("Compare"), image(png(100, 70, 1)), text("and"), image(png(40, 90, 2))]},
    {"role": "assistant", "content": "The first is wider."},
    {"role": "user", "content": [image(png(64, 64, 3)), text("And this one?")]},
]


def make(path, **kw):
    kw.setdefault("max_context", 1024)
    kw.setdefault("page_size", 16)
    kw.setdefault("speculative_tokens", 0)
    return Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", **kw))


@pytest.fixture(scope="module")
def engine(checkpoint):
    e = make(checkpoint("gqa3_ratio3"), profile="C4")
    yield e
    e.close()


@pytest.fixture(scope="module")
def hf(checkpoint):
    model = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint("gqa3_ratio3"), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def prompt_of(engine, messages):
    """The expanded prompt ids and processed images the engine makes of these messages."""
    plain, data = split_images(messages)
    images = engine.process_images(data)
    return engine.expand_images(engine.encode_prompt(plain), images), images


def reference(hf, engine, messages, n):
    ids, images = prompt_of(engine, messages)
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor([ids]), pixel_values=torch.cat([i.pixel_values for i in images]),
                          image_grid_thw=torch.tensor([i.grid for i in images]),
                          mm_token_type_ids=(torch.tensor([ids]) == engine.model_config.image_token_id).int(),
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def run(engine, messages, n=8):
    return engine.generate(messages, SamplingParams(max_tokens=n, **GREEDY))


@pytest.mark.parametrize("messages", [ONE, SEVERAL], ids=["one", "several"])
def test_image_chat_equals_transformers(engine, hf, messages):
    want = reference(hf, engine, messages, 8)
    assert len(set(want)) > 1
    out = run(engine, messages)
    assert out.token_ids == want
    assert out.prompt_tokens == len(prompt_of(engine, messages)[0])
    assert engine.accepts_images and engine.stats()["images_encoded"] >= 1


def test_prefill_chunks_smaller_than_an_image_equal_transformers(checkpoint, hf):
    """Steps of 16 tokens: every image is split across steps, and each step encodes one image at most."""
    e = make(checkpoint("gqa3_ratio3"), prefill_chunk=16)
    try:
        assert run(e, SEVERAL).token_ids == reference(hf, e, SEVERAL, 8)
        assert e.stats()["images_encoded"] == 3
    finally:
        e.close()


def test_images_encoded_a_stage_per_step_equal_transformers(checkpoint, hf, monkeypatch):
    """A tower stage per engine step (what the largest images get): the prompt waits for each image's last stage,
    other requests decode meanwhile, and the output is still transformers'."""
    from engine.vision import encoder
    monkeypatch.setattr(encoder, "TOWER_PATCHES_PER_STEP", 1)
    e = make(checkpoint("gqa3_ratio3"), profile="C4")
    try:
        text = e.submit([{"role": "user", "content": "Tell me about the sea."}],
                        SamplingParams(max_tokens=12, **GREEDY))
        assert run(e, SEVERAL).token_ids == reference(hf, e, SEVERAL, 8)
        assert len([t for ev in text for t in ev.token_ids]) == 12
        image = prompt_of(e, ONE)[1][0]
        stages = e._encoder.start(image)
        steps = [stages.advance() for _ in range(e._encoder.tower.cfg.depth + 2)]
        assert all(s is None for s in steps[:-1]) and torch.equal(steps[-1], e._encoder.encode(image))
    finally:
        e.close()


def test_prefix_cache_same_image_hits_another_misses(checkpoint):
    e = make(checkpoint("gqa3_ratio3"))
    cold = make(checkpoint("gqa3_ratio3"))
    try:
        system = {"role": "system", "content": "You describe pictures. " * 6}
        first = [system, {"role": "user", "content": [image(png(96, 96, 7)), text("Describe it.")]}]
        out = run(e, first)
        follow = first + [{"role": "assistant", "content": "Noise."},
                          {"role": "user", "content": [text("Are you sure?")]}]
        again = run(e, follow)
        assert again.usage.cached_tokens > len(prompt_of(e, first)[0]) - 32   # past the image
        assert again.token_ids == run(cold, follow).token_ids
        # another image of the same size: the cache serves the system prompt only
        other = [system, {"role": "user", "content": [image(png(96, 96, 8)), text("Describe it.")]}]
        ids, _ = prompt_of(e, other)
        start = ids.index(e.model_config.image_token_id)
        missed = run(e, other)
        assert missed.usage.cached_tokens <= start
        assert missed.token_ids == run(cold, other).token_ids
        assert out.token_ids == run(cold, first).token_ids
    finally:
        e.close()
        cold.close()


def test_a_hit_ending_inside_an_image_encodes_it_again(checkpoint):
    """A regenerated turn whose image runs up to the prompt's last page: the snapshot boundary (before the last
    <|im_start|>) falls inside the image, so the next request's hit ends there and the image's last rows need it."""
    e = make(checkpoint("gqa3_ratio3"))
    cold = make(checkpoint("gqa3_ratio3"))
    try:
        for pad in range(16):       # a prompt whose hit boundary is inside the image
            messages = [{"role": "system", "content": "x" * pad},
                        {"role": "user", "content": [image(png(64, 96, 9)), text("?")]}]
            ids, images = prompt_of(e, messages)
            start = ids.index(e.model_config.image_token_id)
            end = start + images[0].num_tokens
            boundary = (len(ids) - 3) // 16 * 16      # the last <|im_start|> opens the assistant turn
            if start < boundary < end:
                break
        else:
            pytest.fail("no prompt put the boundary inside the image")
        first = run(e, messages)
        encoded = e.stats()["images_encoded"]
        second = run(e, messages)
        assert second.usage.cached_tokens == boundary
        assert e.stats()["images_encoded"] == encoded + 1
        assert first.token_ids == second.token_ids == run(cold, messages).token_ids
    finally:
        e.close()
        cold.close()


def test_batched_with_text_requests_equals_alone(engine):
    texts = [[{"role": "user", "content": "Tell me about the sea."}],
             [{"role": "user", "content": [text("Count to five.")]}]]
    alone = [run(engine, m, 12).token_ids for m in [SEVERAL, *texts]]
    handles = [engine.submit(m, SamplingParams(max_tokens=12, **GREEDY)) for m in [SEVERAL, *texts]]
    together = [[t for ev in h for t in ev.token_ids] for h in handles]
    assert together == alone


@pytest.mark.parametrize("k, p", [(2, 0.8), (3, 0.5)])
def test_speculative_rounds_with_images_equal_plain_greedy(checkpoint, engine, k, p):
    want = run(engine, SEVERAL, 24).token_ids
    e = make(checkpoint("gqa3_ratio3"), speculative_tokens=k)
    try:
        ids, _ = prompt_of(e, SEVERAL)
        e.set_draft_oracle(DraftOracle(p, {tuple(ids): ids + want}), adaptive=False)
        out = run(e, SEVERAL, 24)
        assert out.token_ids == want
        assert out.usage.speculation.rounds > 0 and out.usage.speculation.accepted > 0
    finally:
        e.close()


def test_bad_images_and_limits_are_one_line_errors(checkpoint, engine):
    def refused(messages, e=engine):
        with pytest.raises(ImageInputError) as info:
            e.submit(messages, SamplingParams(max_tokens=2))
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "cannot be read" in refused([{"role": "user", "content": [image(b"not an image at all")]}])
    assert "image 2" in refused([{"role": "user", "content": [image(png(32, 32)), image(png(32, 32)[:60])]}])
    small = make(checkpoint("gqa3_ratio3"), max_images=1, max_image_bytes=4000)
    try:
        assert "at most 1" in refused([{"role": "user", "content": [image(png(32, 32)), image(png(32, 32))]}], small)
        assert "MiB" in refused([{"role": "user", "content": [image(png(200, 200))]}], small)
    finally:
        small.close()
    off = make(checkpoint("gqa3_ratio3"), vision="off")
    try:
        assert not off.accepts_images
        assert refused(ONE, off) == "the loaded model has no vision"
        assert off.generate([{"role": "user", "content": [text("hi")]}], SamplingParams(max_tokens=2)).token_ids
    finally:
        off.close()
    # the engine still serves after the refusals
    assert run(engine, ONE, 2).token_ids
