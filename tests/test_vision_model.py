"""The whole multimodal forward (tower -> image embeddings scattered into the prompt's rows -> 3-axis positions ->
our Qwen3_5Model) against transformers' Qwen3_5ForConditionalGeneration on tiny random checkpoints (fp32, CPU)."""

import copy
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration

from engine.chat.template import ChatTemplate
from engine.cache.pages import CacheTensors
from engine.model.load import load_model
from engine.model.batch import build_batch
from engine.text.tokenizer import Tokenizer
from engine.vision.positions import mrope_positions
from engine.vision.processor import load_processor_config, preprocess
from engine.vision.tokens import expand_image_placeholders, image_rows
from engine.vision.tower import load_vision_tower
from tests.fixtures.hf_pairs import rel_err

PAGE = 16


class Pair:
    """Our model, tower and prompt tools beside transformers' model, from the same checkpoint."""

    def __init__(self, path):
        self.hf = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
        self.hf.generation_config.eos_token_id = None
        self.model, vision = load_model(path, "cpu", torch.float32, mtp=False, vision=True)
        self.cfg = self.model.cfg
        self.tower = load_vision_tower(self.cfg.vision, vision, torch.float32, "cpu")
        self.processor = load_processor_config(path)
        self.tokenizer = Tokenizer.from_checkpoint(path)
        self.template = ChatTemplate.from_checkpoint(path)

    def prompt(self, messages, sizes, seed=0):
        """-> (expanded token ids, processed images) for a conversation whose image parts take `sizes` in order."""
        rng = np.random.default_rng(seed)
        images = [preprocess(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)), self.processor)
                  for w, h in sizes]
        ids = self.tokenizer.encode(self.template.render(messages))
        return expand_image_placeholders(ids, self.cfg.image_token_id, images), images

    def reference(self, ids, images, float64=False):
        """transformers' logits [T, vocab], given what its processor would give it. float64: transformers run in
        double precision, the truth that both fp32 runs approximate (its own fp32 run can be the farther one:
        behind some images its torch GDN path drifts 1.9e-4 from it where ours stays within 3e-5)."""
        hf, dtype = self.hf, torch.float32
        if float64:
            if getattr(self, "hf64", None) is None:
                self.hf64 = copy.deepcopy(self.hf).double()
            hf, dtype = self.hf64, torch.float64
        with torch.no_grad():
            return hf(input_ids=torch.tensor([ids]), pixel_values=torch.cat([i.pixel_values for i in images]).to(dtype),
                      image_grid_thw=torch.tensor([i.grid for i in images]),
                      mm_token_type_ids=(torch.tensor([ids]) == self.cfg.image_token_id).int()).logits[0].float()

    def steps(self, ids, images, chunks, text_positions=False):
        """Our logits of every row, the prompt computed in prefill steps of `chunks` tokens, one set of pools."""
        pools = CacheTensors.allocate(self.cfg, 64, PAGE, 1, torch.float32, "cpu")
        pages = list(range(-(-len(ids) // PAGE)))
        grids = [i.grid for i in images]
        positions = None if text_positions else \
            mrope_positions(ids, self.cfg.image_token_id, grids, self.cfg.vision.spatial_merge_size)
        with torch.no_grad():
            embeds = self.tower(torch.cat([i.pixel_values for i in images]), grids)
            out, start = [], 0
            for n in chunks:
                rows, index = image_rows(ids, self.cfg.image_token_id, start, start + n)
                batch = build_batch([n], [start], [0], [pages], PAGE, "cpu", last_only=False, mrope=[positions],
                                    image_rows=[rows], image_embeds=embeds[index])
                out.append(self.model.logits(self.model(torch.tensor(ids[start:start + n]), batch, pools)))
                start += n
        return torch.cat(out)


@pytest.fixture(scope="module")
def pair(checkpoint):
    made = {}

    def get(name):
        if name not in made:
            made[name] = Pair(checkpoint(name))
        return made[name]

    return get


ONE_IMAGE = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}]
SEVERAL = [  # two images in an earlier turn, one in the last
    {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                 {"type": "text", "text": "and"}, {"type": "image"}]},
    {"role": "assistant", "content": "The first is wider."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this one?"}]},
]
CASES = {"one": (ONE_IMAGE, [(100, 70)]), "several": (SEVERAL, [(100, 70), (40, 90), (64, 64)])}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["gqa3_ratio3", "wrapper_tied_sharded_bf16"])
def test_multimodal_logits_match_transformers(pair, name, case):
    p = pair(name)
    messages, sizes = CASES[case]
    ids, images = p.prompt(messages, sizes)
    ref = p.reference(ids, images)
    ours = p.steps(ids, images, [len(ids)])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < 1e-4
    # the test sees positions: the same forward with text positions is far off
    assert rel_err(p.steps(ids, images, [len(ids)], text_positions=True), ref) > 1e-3


def test_chunked_prefill_then_decode_matches_transformers_generate(pair):
    """Prefill steps that split an image's run, then decode at index + delta: greedy tokens equal transformers'."""
    p = pair("gqa3_ratio3")
    ids, images = p.prompt(SEVERAL, [(100, 70), (40, 90), (64, 64)], seed=1)
    first = ids.index(p.cfg.image_token_id)
    with torch.no_grad():
        ref = p.hf.generate(input_ids=torch.tensor([ids]), pixel_values=torch.cat([i.pixel_values for i in images]),
                            image_grid_thw=torch.tensor([i.grid for i in images]),
                            mm_token_type_ids=(torch.tensor([ids]) == p.cfg.image_token_id).int(),
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert len(set(ref)) > 1
    # prompt + continuation in three steps, the first ending inside an image's run
    sequence = ids + ref[:-1]
    n_prompt = len(ids)
    logits = p.steps(sequence, images, [first + 3, n_prompt - first - 3, len(sequence) - n_prompt])
    assert logits[n_prompt - 1:].argmax(-1).tolist() == ref
    assert rel_err(logits, p.reference(sequence, images, float64=True)) < 1e-4


def test_decode_positions_continue_at_index_plus_delta(pair):
    """Decode one token at a time (positions past the prompt: index + delta), as the engine's decode steps would."""
    p = pair("wrapper_tied_sharded_bf16")
    ids, images = p.prompt(ONE_IMAGE, [(100, 70)])
    grids = [i.grid for i in images]
    positions = mrope_positions(ids, p.cfg.image_token_id, grids, p.cfg.vision.spatial_merge_size)
    assert positions.delta < 0
    pools = CacheTensors.allocate(p.cfg, 64, PAGE, 1, torch.float32, "cpu")
    pages = list(range(8))
    with torch.no_grad():
        embeds = p.tower(torch.cat([i.pixel_values for i in images]), grids)
        rows, index = image_rows(ids, p.cfg.image_token_id, 0, len(ids))
        batch = build_batch([len(ids)], [0], [0], [pages], PAGE, "cpu", mrope=[positions], image_rows=[rows],
                            image_embeds=embeds[index])
        logits = [p.model.logits(p.model(torch.tensor(ids), batch, pools))[-1]]
        tokens = [logits[-1].argmax().item()]
        for _ in range(5):
            n = len(ids) + len(tokens) - 1
            batch = build_batch([1], [n], [0], [pages], PAGE, "cpu", mrope=[positions])
            assert batch.decode_len == 1 and batch.positions[:, 0].tolist() == [n + positions.delta] * 3
            logits.append(p.model.logits(p.model(torch.tensor(tokens[-1:]), batch, pools))[-1])
            tokens.append(logits[-1].argmax().item())
    full = p.reference(ids + tokens[:-1], images)[len(ids) - 1:]
    assert full.argmax(-1).tolist() == tokens
    assert rel_err(torch.stack(logits), full) < 1e-4
