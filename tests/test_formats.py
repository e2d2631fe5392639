"""Quantized checkpoint readers: GPTQ / AWQ repacking from known integers, FP8 block dequantization,
format detection and its refusals, and reading single weights from a checkpoint directory."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.weights.formats import (ActOrderInt4, SourceFormat, UnsupportedFormatError, WeightSource,
                                    dequantize_fp8_block, detect_format, read_config, unpack_awq, unpack_gptq)
from engine.weights.quantize import Int4, dequantize

N, K, G = 48, 256, 64
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _int32(x64):
    return torch.where(x64 >= 2 ** 31, x64 - 2 ** 32, x64).to(torch.int32)


def pack_along_rows(v):
    """int [R, C] -> int32 [R/8, C]: row r sits at bits 4*(r % 8) of row r // 8 (GPTQ qweight)."""
    out = torch.zeros(v.shape[0] // 8, v.shape[1], dtype=torch.int64)
    for j in range(8):
        out |= v[j::8].long() << (4 * j)
    return _int32(out)


def pack_along_cols(v, order=tuple(range(8))):
    """int [R, C] -> int32 [R, C/8]: nibble i of word c holds column 8c + order[i] (GPTQ qzeros; AWQ)."""
    out = torch.zeros(v.shape[0], v.shape[1] // 8, dtype=torch.int64)
    for i, col in enumerate(order):
        out |= v[:, col::8].long() << (4 * i)
    return _int32(out)


def known_int4(seed=0, zero_low=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g)
    z = torch.randint(zero_low, 16, (N, K // G), generator=g)
    s = (torch.rand(N, K // G, generator=g) * 0.02 + 0.001).half()
    return q, z, s


def expected(q, z, s, group_of_k):
    return (q.float() - z[:, group_of_k].float()) * s[:, group_of_k].float()


@pytest.mark.parametrize("v2", [False, True])
def test_gptq_repack_is_exact(v2):
    q, z, s = known_int4(zero_low=0 if v2 else 1)
    stored = z if v2 else z - 1                      # v1 stores zero - 1
    t = unpack_gptq(pack_along_rows(q.T), pack_along_cols(stored.T), s.T.contiguous(),
                    torch.arange(K, dtype=torch.int32) // G, zero_offset=0 if v2 else 1)
    assert isinstance(t, Int4) and t.group_size == G and torch.equal(t.q, q.to(torch.uint8))
    assert torch.equal(dequantize(t), expected(q, z, s, torch.arange(K) // G))


def test_gptq_v1_zero_nibble_15_reads_as_16():
    """v1 cannot store zero 0 (it wraps to nibble 15); the GPTQ kernels then read 15 + 1 = 16. So do we."""
    q, _, s = known_int4()
    stored = torch.full((K // G, N), 15)
    t = unpack_gptq(pack_along_rows(q.T), pack_along_cols(stored), s.T.contiguous())
    assert (t.zeros == 16).all()


def test_gptq_act_order_is_exact_with_a_permutation():
    q, z, s = known_int4(seed=1, zero_low=1)
    g = torch.Generator().manual_seed(2)
    order = torch.randperm(K, generator=g)          # GPTQ's quantization order of the input channels
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[order] = (torch.arange(K) // G).int()
    t = unpack_gptq(pack_along_rows(q.T), pack_along_cols((z - 1).T), s.T.contiguous(), g_idx)
    assert isinstance(t, ActOrderInt4)
    W = expected(q, z, s, g_idx.long())
    assert torch.equal(dequantize(t.weight), W[:, t.perm])
    x = torch.randn(5, K)
    assert torch.allclose(x[:, t.perm] @ dequantize(t.weight).T, x @ W.T, atol=1e-5)


def test_gptq_uneven_groups_are_refused():
    q, z, s = known_int4()
    g_idx = torch.zeros(K, dtype=torch.int32)
    g_idx[-1] = 1
    with pytest.raises(UnsupportedFormatError, match="g_idx"):
        unpack_gptq(pack_along_rows(q.T), pack_along_cols(z.T), s.T.contiguous(), g_idx)


def test_awq_repack_is_exact():
    q, z, s = known_int4(seed=3)
    t = unpack_awq(pack_along_cols(q.T, AWQ_ORDER), pack_along_cols(z.T, AWQ_ORDER), s.T.contiguous())
    assert torch.equal(t.q, q.to(torch.uint8)) and torch.equal(t.zeros.float(), z.float())
    assert torch.equal(dequantize(t), expected(q, z, s, torch.arange(K) // G))


def fp8_block_quantize(W, bn, bk):
    """Reference producer: per (bn, bk) block, scale = absmax / 448, weight = W / scale in e4m3."""
    nb, kb = -(-W.shape[0] // bn), -(-W.shape[1] // bk)
    scale = torch.empty(nb, kb)
    w8 = torch.empty(W.shape, dtype=torch.float8_e4m3fn)
    for i in range(nb):
        for j in range(kb):
            block = W[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            scale[i, j] = block.abs().max() / 448
            w8[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (block / scale[i, j]).to(torch.float8_e4m3fn)
    return w8, scale


def test_fp8_block_dequantization_matches_a_blockwise_reference():
    W = torch.randn(200, 300) * 0.05                 # not multiples of the block: ragged edge blocks
    w8, scale_inv = fp8_block_quantize(W, 128, 128)
    ref = torch.empty(200, 300)
    for i in range(2):
        for j in range(3):
            rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 128, (j + 1) * 128)
            ref[rows, cols] = w8[rows, cols].float() * scale_inv[i, j]
    assert torch.equal(dequantize_fp8_block(w8, scale_inv, (128, 128)), ref)
    assert ((ref - W).norm() / W.norm()) < 0.05
    with pytest.raises(ValueError, match="scale_inv"):
        dequantize_fp8_block(w8, scale_inv[:1], (128, 128))


def cfg(qc=None, dtype="bfloat16"):
    c = {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "dtype": dtype}}
    return {**c, "quantization_config": qc} if qc else c


@pytest.mark.parametrize("config, fmt", [
    (cfg(), "bf16"),
    (cfg(dtype="float16"), "fp16"),
    ({"model_type": "qwen3_5_text", "torch_dtype": "float32"}, "fp32"),
    (cfg({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head"]}), "fp8_block"),
    (cfg({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}), "gptq"),
    (cfg({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}), "gptq"),
    (cfg({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}), "awq"),
])
def test_detect_format(config, fmt):
    assert detect_format(config, ["model.language_model.layers.0.mlp.down_proj.weight"]) == fmt


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes.*original bf16"),
    ({"quant_method": "exl2"}, "'exl2' is not supported"),
    ({"quant_method": "gguf"}, "'gguf' is not supported"),
    ({"quant_method": "compressed-tensors"}, "llm-compressor"),
    ({"quant_method": "gptq", "bits": 8}, "bits=8"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "marlin"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "gemv"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "per-tensor"),
])
def test_unsupported_formats_are_refused_with_a_reason(qc, message):
    with pytest.raises(UnsupportedFormatError, match=message):
        detect_format(cfg(qc), [])


def test_quantized_tensors_without_a_config_are_refused():
    with pytest.raises(UnsupportedFormatError, match="no quantization_config"):
        detect_format(cfg(), ["model.layers.0.mlp.down_proj.qweight"])


def write(tmp_path, config, tensors, side=None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if side:
        (tmp_path / side[0]).write_text(json.dumps(side[1]))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


P = "model.language_model.layers.0."


def test_gptq_checkpoint_reads_weight_by_weight(tmp_path):
    q, z, s = known_int4(zero_low=1)
    norm = torch.ones(K)
    path = write(tmp_path, cfg(), {
        P + "mlp.down_proj.qweight": pack_along_rows(q.T), P + "mlp.down_proj.qzeros": pack_along_cols((z - 1).T),
        P + "mlp.down_proj.scales": s.T.contiguous(), P + "mlp.down_proj.g_idx": (torch.arange(K) // G).int(),
        P + "input_layernorm.weight": norm},
        side=("quantize_config.json", {"bits": 4, "group_size": G, "desc_act": False, "sym": False}))
    assert read_config(path)["quantization_config"]["quant_method"] == "gptq"
    source = WeightSource(path)
    assert source.format == SourceFormat("gptq", zero_offset=1)
    assert source.shapes == {P + "mlp.down_proj.weight": (N, K), P + "input_layernorm.weight": (K,)}
    assert torch.equal(dequantize(source.read(P + "mlp.down_proj.weight")), expected(q, z, s, torch.arange(K) // G))
    assert torch.equal(source.read(P + "input_layernorm.weight"), norm)
    source.close()


def test_awq_checkpoint_reads_weight_by_weight(tmp_path):
    q, z, s = known_int4(seed=5)
    path = write(tmp_path, {"model_type": "qwen3_5_text"}, {
        P + "linear_attn.out_proj.qweight": pack_along_cols(q.T, AWQ_ORDER),
        P + "linear_attn.out_proj.qzeros": pack_along_cols(z.T, AWQ_ORDER),
        P + "linear_attn.out_proj.scales": s.T.contiguous()},
        side=("quant_config.json", {"zero_point": True, "q_group_size": G, "w_bit": 4, "version": "GEMM"}))
    source = WeightSource(path)
    assert source.format.kind == "awq" and source.shapes == {P + "linear_attn.out_proj.weight": (N, K)}
    assert torch.equal(dequantize(source.read(P + "linear_attn.out_proj.weight")),
                       expected(q, z, s, torch.arange(K) // G))


def test_fp8_checkpoint_reads_weight_by_weight(tmp_path):
    W = torch.randn(N, K) * 0.05
    w8, scale_inv = fp8_block_quantize(W, 32, 128)
    a = torch.randn(4, K).to(torch.bfloat16)          # in modules_to_not_convert: stored in bf16
    path = write(tmp_path, cfg({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 128]}), {
        P + "mlp.up_proj.weight": w8, P + "mlp.up_proj.weight_scale_inv": scale_inv,
        P + "linear_attn.in_proj_a.weight": a})
    source = WeightSource(path)
    assert source.format == SourceFormat("fp8_block", block=(32, 128))
    assert source.shapes == {P + "mlp.up_proj.weight": (N, K), P + "linear_attn.in_proj_a.weight": (4, K)}
    up = source.read(P + "mlp.up_proj.weight")
    assert up.dtype == torch.bfloat16
    assert torch.equal(up, dequantize_fp8_block(w8, scale_inv, (32, 128)).to(torch.bfloat16))
    assert torch.equal(source.read(P + "linear_attn.in_proj_a.weight"), a)


FP8_LINEARS = re.compile(r"(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|"
                         r"shared_expert\.(gate|up|down)_proj|experts\.\d+\.(gate|up|down)_proj)\.weight$")


def blockwise(w8, scale, bn, bk):
    """The reference dequantization, written out: each (bn, bk) block times its scale, rounded to bf16 once."""
    s = scale.float().repeat_interleave(bn, 0)[:w8.shape[0]].repeat_interleave(bk, 1)[:, :w8.shape[1]]
    return (w8.float() * s).to(torch.bfloat16)


def fp8_moe_copy(src, fp8_dir, deq_dir, block, scale_dtype):
    """A tiny MoE checkpoint as an FP8 release stores it (the linears Qwen's FP8 releases quantize; fused experts
    as transformers holds them in FP8: each expert's gate and up halves in blocks of their own), and its
    dequantized 16-bit self."""
    bn, bk = block
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    fp8, deq = {}, {}
    for name, t in tensors.items():
        if FP8_LINEARS.search(name):
            w8, scale = fp8_block_quantize(t.float(), bn, bk)
            scale = scale.to(scale_dtype)
            fp8[name], fp8[name + "_scale_inv"], deq[name] = w8, scale, blockwise(w8, scale, bn, bk)
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            halves = 2 if name.endswith("gate_up_proj") else 1
            parts = [fp8_block_quantize(half.float(), bn, bk) for e in t for half in e.chunk(halves)]
            w8 = torch.stack([w for w, _ in parts]).view(t.shape)
            scale = torch.stack([s for _, s in parts]).view(t.shape[0], -1, parts[0][1].shape[1])
            fp8[name], fp8[name + "_scale_inv"] = w8, scale
            deq[name] = torch.stack([torch.cat([blockwise(*parts[e * halves + h], bn, bk) for h in range(halves)])
                                     for e in range(t.shape[0])])
        else:
            fp8[name] = deq[name] = t
    config = json.loads((src / "config.json").read_text())
    for out, state, qc in ((fp8_dir, fp8, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                           "weight_block_size": list(block),
                                           "modules_to_not_convert": ["lm_head", "mlp.gate", "model.visual"]}),
                           (deq_dir, deq, None)):
        shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
        (out / "config.json").write_text(json.dumps({**config, **({"quantization_config": qc} if qc else {})}))
        save_file(state, str(out / "model.safetensors"))
    return sum(t.dtype == torch.float8_e4m3fn for t in fp8.values())


@pytest.mark.parametrize("spec, block, scale_dtype", [
    ("moe_wrapper_ties", (16, 32), torch.bfloat16),   # experts one by one, as Qwen's -FP8 releases (bf16 scales)
    ("moe", (16, 32), torch.float32),                 # fused experts in FP8, as transformers holds them
])
def test_fp8_moe_checkpoint_loads_as_its_dequantized_self(checkpoint, tmp_path, spec, block, scale_dtype):
    """Every FP8 linear of a tiny MoE checkpoint (experts, shared expert, attention, GDN, MTP) dequantized by its
    block scales: the model scores exactly as one loaded from the dequantized 16-bit copy."""
    from engine.api import Engine, EngineConfig
    quantized = fp8_moe_copy(checkpoint(spec), tmp_path / "fp8", tmp_path / "deq", block, scale_dtype)
    assert quantized > 0
    source = WeightSource(tmp_path / "fp8")
    assert source.format == SourceFormat("fp8_block", block=block)
    expert = next(n for n in source.shapes if ".experts.1.up_proj" in n)
    assert source.read(expert).dtype == torch.bfloat16
    source.close()
    kw = dict(device="cpu", dtype="float32", max_context=256, speculative_tokens=3)
    engines = [Engine(EngineConfig(model=str(tmp_path / d), **kw)) for d in ("fp8", "deq")]
    try:
        assert all(e._model.mtp is not None for e in engines)
        ids = torch.randint(0, engines[0].model_config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
        a, b = (e.score(ids.tolist()) for e in engines)
        assert torch.equal(a, b)
        for (name, p), (_, q) in zip(engines[0]._model.named_parameters(), engines[1]._model.named_parameters()):
            assert torch.equal(p, q), name
    finally:
        for e in engines:
            e.close()


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["bf16", "int4"])
def test_gpu_fp8_moe_checkpoint_loads_as_its_dequantized_self(checkpoint, tmp_path, weights):
    """On CUDA, [128, 128] blocks, fused FP8 experts read on the device, as a 24 GB card loads an FP8 release (int4:
    dequantized, then converted): the same greedy tokens and logits as the dequantized 16-bit copy."""
    from engine.api import Engine, EngineConfig, SamplingParams
    fp8_moe_copy(checkpoint("moe128"), tmp_path / "fp8", tmp_path / "deq", (128, 128), torch.float32)
    engines = [Engine(EngineConfig(model=str(tmp_path / d), device="cuda", max_context=512, weights=weights))
               for d in ("fp8", "deq")]
    try:
        ids = torch.randint(0, engines[0].model_config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
        a, b = (e.score(ids.tolist()) for e in engines)
        assert torch.equal(a, b)
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        first, second = (e.generate(ids.tolist(), params).token_ids for e in engines)
        assert first == second
    finally:
        for e in engines:
            e.close()


def test_fused_fp8_experts_with_misshapen_scales_are_refused(tmp_path):
    w8, _ = fp8_block_quantize(torch.randn(2 * 32, 64), 16, 32)
    path = write(tmp_path, cfg({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 32]}), {
        P + "mlp.experts.gate_up_proj": torch.stack([w8, w8]),
        P + "mlp.experts.gate_up_proj_scale_inv": torch.ones(2, 3, 2)})
    source = WeightSource(path)
    with pytest.raises(ValueError, match="gate_up_proj_scale_inv is \\[2, 3, 2\\].*needs \\[2, 4, 2\\]"):
        source.read(P + "mlp.experts.0.gate_proj.weight")
    source.close()


def test_gptq_moe_checkpoint_loads_as_its_dequantized_self(checkpoint, tmp_path):
    """A community GPTQ int4 MoE release (experts one by one, 4 bits, group 128, v1 zeros; the rest 16-bit) of a tiny
    MoE: 16-bit loads score exactly as the dequantized copy (scales powers of two: every weight exact in bf16), and
    an int4 load keeps each expert's codes as they are (its stacked experts dequantize to the copy's weights)."""
    from engine.api import Engine, EngineConfig
    src, group = checkpoint("moe128"), 128
    tensors = load_file(str(src / "model.safetensors"))
    gptq, deq = {}, {}
    gen = torch.Generator().manual_seed(9)
    for name, t in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            gptq[name] = deq[name] = t
            continue
        halves = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
        for e, w in enumerate(t):
            for kind, part in zip(halves, w.chunk(len(halves))):
                n, k = part.shape
                q = torch.randint(0, 16, (n, k), generator=gen)
                z = torch.randint(1, 17, (n, k // group), generator=gen)
                s = (2.0 ** -torch.randint(5, 9, (n, k // group), generator=gen)).half()
                base = f"{name.rsplit('.', 1)[0]}.{e}.{kind}."
                gptq.update({base + "qweight": pack_along_rows(q.T), base + "qzeros": pack_along_cols((z - 1).T),
                             base + "scales": s.T.contiguous(), base + "g_idx": (torch.arange(k) // group).int()})
                deq[base + "weight"] = expected(q, z, s, torch.arange(k) // group)
    config = json.loads((src / "config.json").read_text())
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False}
    for out, state, extra in ((tmp_path / "gptq", gptq, {"quantization_config": qc}), (tmp_path / "deq", deq, {})):
        shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors"))
        (out / "config.json").write_text(json.dumps({**config, **extra}))
        save_file(state, str(out / "model.safetensors"))
    kw = dict(device="cpu", dtype="float32", max_context=256, speculative_tokens=3)
    loaded = {(d, w): Engine(EngineConfig(model=str(tmp_path / d), weights=w, quant_method="rtn", **kw))
              for d, w in (("gptq", "bf16"), ("deq", "bf16"), ("gptq", "int4"))}
    try:
        ids = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(3)).tolist()
        assert torch.equal(loaded["gptq", "bf16"].score(ids), loaded["deq", "bf16"].score(ids))
        quant, ref = loaded["gptq", "int4"]._model, loaded["deq", "bf16"]._model
        moes = [(a.mlp, b.mlp) for a, b in zip([*quant.layers, quant.mtp.layer], [*ref.layers, ref.mtp.layer])]
        for a, b in moes:            # the routed experts' rows (a shared expert stacked after them: 16-bit here)
            gate_up, down = 2 * a.inter * a.num_experts, a.hidden * a.num_experts
            assert a.gate_up.scheme == a.down.scheme == "int4"
            assert torch.equal(a.gate_up.dequantized()[:gate_up], b.gate_up.weight[:gate_up])
            assert torch.equal(a.down.dequantized()[:down], b.down.weight[:down])
    finally:
        for e in loaded.values():
            e.close()
