"""The DFlash / DFlash2 drafter (engine/model/dflash.py) against the reference implementation (the `dflash` package,
installed without its dependencies by the Makefile), on tiny random configs in fp32: the same hidden states and draft
logits over several rounds of context (its K / V kept, the block's dropped), the same DFlash2 drafts; and the
one-line refusals of a drafter made for another model."""

import pytest
import torch

from engine.model.config import parse_model_config
from engine.model.dflash import Drafter
from engine.model.drafter_config import DrafterMismatch, check_drafter, parse_drafter_config
from engine.bench.random_model import text_config

dflash_model = pytest.importorskip("dflash.model")
transformers = pytest.importorskip("transformers")

HIDDEN, VOCAB, TAPS, BLOCK = 32, 64, [0, 1, 3], 4          # (taps of the 4-layer tiny target)


def tiny_config(variant: str, causal: bool | None = None) -> dict:
    extra = {"target_layer_ids": TAPS, "block_size": BLOCK, "mask_token_id": VOCAB - 1}
    if variant == "dflash2":
        extra.update(conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=5)
    config = dict(architectures=["DFlashDraftModel" if variant == "dflash" else "DFlash2DraftModel"],
                  vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                  use_sliding_window=True, sliding_window=5,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                  num_target_layers=4, dflash_config=extra, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 10000.0})
    if causal is not None:
        config["is_causal"] = causal
    return config


def reference_model(config: dict):
    cls = dflash_model.DFlashDraftModel if config["dflash_config"].get("conv_kernel_size") is None \
        else dflash_model.DFlash2DraftModel
    model = cls(transformers.Qwen3Config(**config)).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if "norm" in name else 0.3
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn(p.shape, generator=gen))
    return model


def ours_from(reference, config: dict) -> Drafter:
    ours = Drafter(parse_drafter_config(config)).float().eval()
    state = {k.replace("predecessor_codebook.weight", "predecessor_codebook")
              .replace("successor_codebook.weight", "successor_codebook"): v
             for k, v in reference.state_dict().items() if "rotary_emb" not in k}
    ours.load_state_dict(state, strict=True)
    return ours


def rounds(seed: int):
    """(new context features, block embeddings) of each round: a prompt of 9 tokens, then rounds that keep 3, 1, 4."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, len(TAPS) * HIDDEN, generator=gen), torch.randn(BLOCK, HIDDEN, generator=gen))
            for n in (9, 3, 1, 4)]


@pytest.mark.parametrize("variant,causal", [("dflash", None), ("dflash", True), ("dflash2", None)])
def test_drafter_matches_the_reference_over_rounds(variant, causal):
    config = tiny_config(variant, causal)
    ref = reference_model(config)
    ours = ours_from(ref, config)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    cache_ref, cache = dflash_model._make_cache(ref.config), ours.new_cache()
    start = 0
    with torch.no_grad():
        for features, block in rounds(1):
            start += features.shape[0]
            positions = torch.arange(start - features.shape[0], start + BLOCK)[None]
            expected = ref(position_ids=positions, noise_embedding=block[None], target_hidden=features[None],
                           past_key_values=cache_ref, use_cache=True)[0]
            dflash_model._crop_to(cache_ref, start)
            ours.extend(cache, features)
            got = ours(block, cache)
            assert cache.length == start
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours.logits(got[1:], head), ref.compute_logits(expected[1:], head),
                                       atol=1e-4, rtol=1e-4)
            if variant == "dflash2":
                anchor = int(torch.randint(0, VOCAB, (1,)))
                want = ref.propose(expected[None, 1:], torch.tensor([anchor]), head, 0.0)[0][0]
                drafts, candidates, probs = ours.candidate_selector.select(got[1:], ours.logits(got[1:], head), anchor)
                assert torch.equal(drafts, want) and candidates.shape == (BLOCK - 1, 5) and probs is None


def test_crop_forgets_the_context_past_a_length():
    config = tiny_config("dflash")
    ours = ours_from(reference_model(config), config)
    cache = ours.new_cache()
    (f1, block), (f2, _) = rounds(2)[:2]
    with torch.no_grad():
        ours.extend(cache, f1)
        before = ours(block, cache)
        ours.extend(cache, f2)
        ours.crop(cache, f1.shape[0])
        assert cache.length == f1.shape[0]
        torch.testing.assert_close(ours(block, cache), before)


def target_config(**over):
    return parse_model_config({**text_config("tiny"), "vocab_size": VOCAB, "hidden_size": HIDDEN, **over})


def test_a_drafter_for_another_model_is_refused_in_one_line():
    target = target_config()
    check_drafter(parse_drafter_config(tiny_config("dflash")), target)
    check_drafter(parse_drafter_config(tiny_config("dflash2")), target)
    cases = {
        "hidden size": {**tiny_config("dflash"), "hidden_size": 48},
        "vocabulary": {**tiny_config("dflash"), "vocab_size": 128},
        "6 layers": {**tiny_config("dflash"), "num_target_layers": 6},
    }
    for words, raw in cases.items():
        with pytest.raises(DrafterMismatch, match=words) as err:
            check_drafter(parse_drafter_config(raw), target)
        assert "\n" not in str(err.value)
    with pytest.raises(DrafterMismatch, match="not a DFlash drafter"):
        parse_drafter_config({**tiny_config("dflash"), "architectures": ["LlamaForCausalLM"]})
    with pytest.raises(DrafterMismatch, match="reads layers"):
        check_drafter(parse_drafter_config({**tiny_config("dflash"), "num_target_layers": None,
                                            "dflash_config": {"target_layer_ids": [0, 99], "mask_token_id": 1}}),
                      target)


def test_a_drafter_checkpoint_loads_as_saved(tmp_path):
    """A checkpoint folder as z-lab publishes it (config.json + model.safetensors) loads into the engine's drafter
    exactly as the same weights in memory do (tests/test_block_drafter.py checks that one drafts as the reference
    does); a missing or misshapen weight is refused in one line."""
    import json

    from safetensors.torch import save_file

    from engine.model.block_drafter import drafter_from_state, load_drafter
    from engine.model.linear import Build
    config = tiny_config("dflash2")
    ours = ours_from(reference_model(config), config)
    state = {k: v.contiguous() for k, v in ours.state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load_drafter(tmp_path, target_config(), "cpu", torch.float32)
    want = drafter_from_state(ours.cfg, Build(torch.float32, "cpu"), state)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    save_file({k: v for k, v in state.items() if k != "fc.weight"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(DrafterMismatch, match="lacks 1 tensor") as err:
        load_drafter(tmp_path, target_config(), "cpu", torch.float32)
    assert "\n" not in str(err.value)
    save_file({**state, "fc.weight": state["fc.weight"][:, :8].contiguous()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(DrafterMismatch, match="fc.weight has shape"):
        load_drafter(tmp_path, target_config(), "cpu", torch.float32)
