"""Bad checkpoints fail with messages that say what is wrong."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import UnsupportedModelError, load_model_config, parse_model_config
from engine.model.load import load_model
from engine.weights.checkpoint import CheckpointError


@pytest.fixture
def copy_of(checkpoint, tmp_path):
    def make(name="base"):
        dst = tmp_path / name
        shutil.copytree(checkpoint(name), dst)
        return dst
    return make


def test_wrong_architecture_names_what_is_supported(copy_of):
    path = copy_of()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UnsupportedModelError, match=r"llama.*qwen3_5"):
        load_model_config(path)


def test_experts_outside_a_moe_model_type_are_refused():
    with pytest.raises(UnsupportedModelError, match="experts belong to qwen3_5_moe"):
        parse_model_config({"model_type": "qwen3_5_text", "num_experts": 64})
    with pytest.raises(UnsupportedModelError, match="experts belong to qwen3_5_moe"):
        parse_model_config({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text"}})


def test_moe_config_needs_its_expert_fields():
    raw = {"model_type": "qwen3_5_moe_text", "vocab_size": 16, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 2, "num_key_value_heads": 1, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32}
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        parse_model_config(raw)
    with pytest.raises(ValueError, match="num_experts_per_tok must be 1..num_experts"):
        parse_model_config({**raw, "shared_expert_intermediate_size": 32, "num_experts_per_tok": 9})
    cfg = parse_model_config({**raw, "shared_expert_intermediate_size": 32})
    assert cfg.is_moe and cfg.num_experts == 8 and cfg.intermediate_size == 0


def test_a_null_rope_theta_is_refused_by_name():
    from engine.bench.random_model import text_config
    raw = text_config("tiny")
    raw["rope_parameters"] = {**raw["rope_parameters"], "rope_theta": None}
    with pytest.raises(ValueError, match="rope_theta is null"):
        parse_model_config(raw)


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_config(tmp_path)


def test_missing_shard(copy_of):
    path = copy_of("wrapper_tied_sharded_bf16")
    victim = sorted(path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"missing shard.*{victim.name}"):
        load_model(path, "cpu", torch.float32)


def test_truncated_safetensors(copy_of):
    path = copy_of()
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="model.safetensors is truncated"):
        load_model(path, "cpu", torch.float32)


def test_garbage_file(copy_of):
    path = copy_of()
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        load_model(path, "cpu", torch.float32)


def test_shape_mismatch(copy_of):
    path = copy_of()
    cfg = json.loads((path / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj.*shape"):
        load_model(path, "cpu", torch.float32)


def test_missing_and_unexpected_tensors(copy_of):
    path = copy_of()
    f = path / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.3.self_attn.k_proj.weight"]
    save_file(tensors, f)
    with pytest.raises(CheckpointError, match=r"lacks 1 tensor.*layers\.3\.self_attn\.k_proj"):
        load_model(path, "cpu", torch.float32)
    tensors["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(32, 64)
    tensors["model.layers.0.mystery.weight"] = torch.zeros(3)
    save_file(tensors, f)
    with pytest.raises(CheckpointError, match=r"does not use.*mystery"):
        load_model(path, "cpu", torch.float32)


def test_checkpoint_without_mtp_loads_with_mtp_off(copy_of):
    path = copy_of()
    f = path / "model.safetensors"
    save_file({k: v for k, v in load_file(f).items() if not k.startswith("mtp.")}, f)
    model, _ = load_model(path, "cpu", torch.float32, mtp=True)
    assert model.mtp is None


def test_real_27b_config_is_read():
    """The published Qwen3.6-27B config.json (its fields that matter) parses into the known facts."""
    raw = {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
        "vision_end_token_id": 248054, "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
            "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
            "eos_token_id": 248044, "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}},
        "vision_config": {"depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304,
                          "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                          "out_hidden_size": 5120, "num_position_embeddings": 2304},
    }
    cfg = parse_model_config(raw)
    assert len(cfg.full_attention_layers) == 16 and cfg.full_attention_layers[0] == 3
    assert len(cfg.linear_attention_layers) == 48
    assert (cfg.rotary_dim, cfg.mrope_section, cfg.rope_theta) == (64, (11, 11, 10), 1e7)
    assert cfg.conv_dim == 2 * 16 * 128 + 48 * 128
    assert cfg.num_mtp_layers == 1 and cfg.vision.depth == 27 and cfg.image_token_id == 248056
    assert cfg.eos_token_ids == (248044,)
