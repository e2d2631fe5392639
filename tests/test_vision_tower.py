"""The vision tower against transformers' Qwen3_5VisionModel, mRoPE positions against its get_rope_index, and the
placeholder-token helpers (expansion, rows per step, prefix-cache hashing)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration

from engine.cache.manager import chain_hashes
from engine.model.config import UnsupportedModelError, VisionConfig, load_model_config, parse_model_config
from engine.model.load import load_model
from engine.model.batch import build_batch
from engine.model.linear import Build
from engine.vision.positions import mrope_positions
from engine.vision.processor import ImageInputError, load_processor_config, parse_processor_config, preprocess
from engine.vision.tokens import expand_image_placeholders, image_hash_tokens, image_rows
from engine.vision.tower import VisionTower, load_vision_tower
from engine.weights.checkpoint import CheckpointError, canonical_name
from engine.weights.convert_cache import convert
from engine.weights.policy import QuantPolicy
from tests.fixtures.checkpoints import QWEN3_5_PREPROCESSOR, VISION, TinySpec, _Random, _vision_tensors
from tests.fixtures.hf_pairs import rel_err

NAMES = ["gqa3_ratio3", "wrapper_tied_sharded_bf16"]    # two tower configs (tests/fixtures/checkpoints.py)


@pytest.fixture(scope="module")
def transformers_model(checkpoint):
    made = {}

    def get(name):
        if name not in made:
            made[name] = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint(name), dtype=torch.float32).eval()
        return made[name]

    return get


def tower_of(path, dtype=torch.float32):
    model, vision = load_model(path, "cpu", dtype, mtp=False, vision=True)
    return load_vision_tower(model.cfg.vision, vision, dtype, "cpu")


GRIDS = [(1, 4, 6), (1, 10, 4), (1, 2, 2), (1, 8, 8)]   # non-square, one merged token, square


@pytest.mark.parametrize("name", NAMES)
def test_tower_matches_transformers(checkpoint, transformers_model, name):
    path = checkpoint(name)
    tower, hf = tower_of(path), transformers_model(name).model.visual
    cfg = load_model_config(path).vision
    patches = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(patches, 3 * cfg.temporal_patch_size * cfg.patch_size ** 2,
                         generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(pixels, grid_thw=torch.tensor(GRIDS)).pooler_output
        ours = tower(pixels, GRIDS)
        one = tower(pixels[:24], GRIDS[:1])                     # images attend only within themselves
    assert ours.shape == ref.shape == (patches // 4, cfg.out_hidden_size)
    assert rel_err(ours, ref) < 1e-4
    assert rel_err(one, ours[:6]) < 1e-5


@pytest.mark.parametrize("rows", [5, 24])
def test_row_chunks_change_nothing(checkpoint, monkeypatch, rows):
    """The row-wise work in chunks (a large image's: tower.CHUNK_ROWS, 4,096 patches) computes each row as one pass
    does; chunks ending inside an image and on an image's end."""
    from engine.vision import tower as tower_module
    path = checkpoint("gqa3_ratio3")
    tower, cfg = tower_of(path), load_model_config(path).vision
    pixels = torch.randn(sum(t * h * w for t, h, w in GRIDS), 3 * cfg.temporal_patch_size * cfg.patch_size ** 2,
                         generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = tower(pixels, GRIDS)
        monkeypatch.setattr(tower_module, "CHUNK_ROWS", rows)
        chunked = tower(pixels, GRIDS)
    assert rel_err(chunked, whole) < 1e-6


def test_tower_in_bf16_is_close_to_fp32(checkpoint):
    path = checkpoint("gqa3_ratio3")
    processor = load_processor_config(path)
    image = preprocess(Image.fromarray(np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)),
                       processor)
    with torch.no_grad():
        full = tower_of(path)(image.pixel_values, [image.grid])
        half = tower_of(path, torch.bfloat16)(image.pixel_values, [image.grid])
    assert half.dtype == torch.bfloat16 and rel_err(half.float(), full) < 3e-2


def test_quantized_tower_follows_the_policy():
    """With the policy's vision scheme int8, the tower's linears are int8 (K a multiple of the group size) and its
    output stays close to the 16-bit tower's."""
    raw = {**VISION, "hidden_size": 128, "intermediate_size": 256}
    spec = TinySpec("wide", wrapper=True, hidden=128, vision=raw)
    tensors = {canonical_name(n)[1]: v for n, v in _vision_tensors(spec, _Random(0)).items()}
    cfg = VisionConfig(**raw, out_hidden_size=128)
    policy = QuantPolicy(vision="int8")
    quantized = {n: convert(v, policy.scheme("model.visual." + n, tuple(v.shape)), policy) for n, v in tensors.items()}
    full = load_vision_tower(cfg, dict(tensors), torch.float32, "cpu")
    int8 = load_vision_tower(cfg, quantized, torch.float32, "cpu", policy)
    assert int8.blocks[0].qkv.linear.scheme == int8.merger_fc2.linear.scheme == "int8"
    pixels = torch.randn(48, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_err(int8(pixels, [(1, 6, 8)]), full(pixels, [(1, 6, 8)])) < 2e-2


def test_tower_load_names_what_is_wrong(checkpoint):
    path = checkpoint("gqa3_ratio3")
    model, vision = load_model(path, "cpu", torch.float32, mtp=False, vision=True)
    missing = dict(vision)
    del missing["blocks.0.attn.qkv.bias"]
    with pytest.raises(CheckpointError, match=r"lacks blocks\.0\.attn\.qkv\.bias"):
        load_vision_tower(model.cfg.vision, missing, torch.float32, "cpu")
    extra = {**vision, "blocks.9.norm1.weight": vision["blocks.0.norm1.weight"]}
    with pytest.raises(CheckpointError, match=r"unexpected blocks\.9\.norm1\.weight"):
        load_vision_tower(model.cfg.vision, extra, torch.float32, "cpu")
    wrong = {**vision, "merger.linear_fc1.weight": vision["merger.linear_fc1.weight"][:, :-1]}
    with pytest.raises(CheckpointError, match=r"merger\.linear_fc1\.weight has shape"):
        load_vision_tower(model.cfg.vision, wrong, torch.float32, "cpu")
    load_vision_tower(model.cfg.vision, vision, torch.float32, "cpu")
    assert vision == {}                                 # taken over: the loader's copies are gone


def test_vision_config(checkpoint):
    raw = json.loads((checkpoint("gqa3_ratio3") / "config.json").read_text())
    cfg = parse_model_config(raw).vision
    assert (cfg.hidden_act, cfg.rope_theta, cfg.head_dim) == ("gelu_pytorch_tanh", 10_000.0, 16)
    raw["vision_config"]["rope_parameters"] = {"rope_type": "axial", "rope_theta": 500.0}
    assert parse_model_config(raw).vision.rope_theta == 500.0
    raw["vision_config"]["hidden_act"] = "relu"
    other = parse_model_config(raw)                      # the text model still loads; the tower is refused
    with pytest.raises(UnsupportedModelError, match="hidden_act 'relu'"):
        VisionTower(other.vision, Build(torch.float32, "cpu"))


# ---- positions --------------------------------------------------------------------------------------------------

IMG = 99          # the image token of these synthetic prompts (text tokens are below it)


def prompt(*parts):
    """Text lengths (int) and image grids (tuple) -> (token ids, grids); tokens of text parts are 1..n."""
    ids, grids = [], []
    for part in parts:
        if isinstance(part, int):
            ids += [1 + i % 50 for i in range(part)]
        else:
            grids.append(part)
            ids += [IMG] * (part[0] * part[1] * part[2] // 4)
    return ids, grids


PROMPTS = {
    "text": prompt(23),
    "one_image": prompt(5, (1, 8, 12), 9),
    "two_images": prompt(4, (1, 4, 6), 3, (1, 20, 6), 11),
    "image_first_and_last": prompt((1, 6, 6), 7, (1, 2, 4)),
    "earlier_turn": prompt(12, (1, 10, 14), 30, (1, 4, 4), 25),
}


@pytest.mark.parametrize("case", PROMPTS)
def test_positions_match_get_rope_index(transformers_model, case):
    ids, grids = PROMPTS[case]
    hf = transformers_model("gqa3_ratio3").model
    input_ids = torch.tensor([ids])
    ref, delta = hf.get_rope_index(input_ids, mm_token_type_ids=(input_ids == IMG).int(),
                                   image_grid_thw=torch.tensor(grids) if grids else None)
    ours = mrope_positions(ids, IMG, grids, 2)
    assert torch.equal(ours.table, ref[:, 0]) and ours.delta == delta.item()
    if not grids:
        assert ours.delta == 0 and torch.equal(ours.table, torch.arange(len(ids)).expand(3, -1))


def test_positions_past_the_prompt_and_in_a_batch():
    ids, grids = PROMPTS["one_image"]
    positions = mrope_positions(ids, IMG, grids, 2)
    n = len(ids)
    assert torch.equal(positions.rows(n - 2, n + 3)[:, 2:], (torch.arange(n, n + 3) + positions.delta).expand(3, -1))
    assert torch.equal(positions.rows(3, 9), positions.table[:, 3:9])
    # a text sequence beside it keeps plain positions; without any mrope the batch is as before
    batch = build_batch([4, 6], [0, 10], [0, 1], [[0], [1, 2]], 16, "cpu", mrope=[None, positions])
    assert torch.equal(batch.positions[:, :4], torch.arange(4).expand(3, -1))
    assert torch.equal(batch.positions[:, 4:], positions.table[:, 10:16])
    plain = build_batch([4, 6], [0, 10], [0, 1], [[0], [1, 2]], 16, "cpu")
    assert torch.equal(build_batch([4, 6], [0, 10], [0, 1], [[0], [1, 2]], 16, "cpu", mrope=[None, None]).positions,
                       plain.positions)
    assert plain.image_rows is None and plain.image_embeds is None


def test_positions_refuse_placeholders_that_do_not_fit():
    ids, grids = PROMPTS["two_images"]
    with pytest.raises(ImageInputError, match="do not match"):
        mrope_positions(ids[:-20], IMG, grids, 2)            # the second run cut short
    with pytest.raises(ImageInputError, match="fewer image placeholders"):
        mrope_positions(ids, IMG, grids + [(1, 2, 2)], 2)


# ---- placeholder tokens -----------------------------------------------------------------------------------------

def images(*specs):
    """(width, height, seed) -> processed images (patch 16, merge 2, small pixel limits)."""
    cfg = parse_processor_config({**QWEN3_5_PREPROCESSOR, "size": {"shortest_edge": 4096, "longest_edge": 65536}})
    return [preprocess(Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)), cfg)
            for w, h, seed in specs]


def test_expand_and_rows_per_step():
    imgs = images((64, 96, 0), (128, 64, 1))
    assert [i.num_tokens for i in imgs] == [6, 8]
    template = [7, 8, 98, IMG, 97, 5, 98, IMG, 97, 6]        # <vision_start> <image_pad> <vision_end> per image
    ids = expand_image_placeholders(template, IMG, imgs)
    assert len(ids) == len(template) - 2 + 14 and ids[3:9] == [IMG] * 6 and ids[12:20] == [IMG] * 8
    seen = []
    for start, end in ((0, 5), (5, 14), (14, 22)):
        rows, index = image_rows(ids, IMG, start, end)
        assert all(ids[start + r] == IMG for r in rows)
        seen += index
    assert seen == list(range(14))
    with pytest.raises(ImageInputError, match="2 image placeholder"):
        expand_image_placeholders(template, IMG, imgs[:1])


def test_image_hashes_hit_the_same_image_and_miss_another():
    page = 4
    same_a, same_b = images((64, 96, 0), (64, 96, 0))
    other = images((64, 96, 5))[0]
    assert same_a.grid == other.grid and same_a.digest == same_b.digest != other.digest
    ids = expand_image_placeholders([1, 2, 3, 4, 5, 98, IMG, 97, 6, 7, 8, 9, 10, 11], IMG, [same_a])
    first = chain_hashes(image_hash_tokens(ids, IMG, [same_a]), page)
    again = chain_hashes(image_hash_tokens(ids, IMG, [same_b]), page)
    miss = chain_hashes(image_hash_tokens(ids, IMG, [other]), page)
    assert first == again                                  # the same image next turn: every page hits
    assert first[0] == miss[0] == chain_hashes(ids, page)[0]   # the page before the image: plain tokens
    assert all(a != b for a, b in zip(first[1:], miss[1:]))    # from the image's first page on: all miss
    hashed = image_hash_tokens(ids, IMG, [same_a])
    assert all(t < 0 for t in hashed[6:12]) and hashed[:6] == ids[:6] and hashed[12:] == ids[12:]
