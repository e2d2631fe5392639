"""Conversion cache: miss -> convert and write -> hit without converting; interrupted conversions leave a
miss, and the next one converts only what the interrupted one had not written; the key follows the source and the
policy; stored weights round-trip exactly."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.weights import convert_cache
from engine.weights.convert_cache import (ConvertCache, _decode, _encode, cache_key, convert, converted_weights,
                                          default_root, source_identity)
from engine.weights.formats import ActOrderInt4
from engine.weights.policy import QuantPolicy
from engine.weights.quantize import Int4, Int8, dequantize

POLICY = QuantPolicy(group_size=32)       # the tiny checkpoint's K (64, 96, 128) are multiples of 32
ROOT = Path(__file__).resolve().parents[1]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def test_miss_converts_and_writes_then_hit_reads_without_converting(checkpoint, tmp_path, monkeypatch):
    path = checkpoint("base")
    cache = ConvertCache(tmp_path / "cache", shard_bytes=20_000)
    key = cache_key(source_identity(path), POLICY)
    assert cache.lookup(key) is None
    progress = []
    first = dict(converted_weights(path, POLICY, cache=cache, progress=lambda d, t: progress.append((d, t))))
    assert progress == [(i, len(first)) for i in range(1, len(first) + 1)]
    assert isinstance(first["model.layers.0.mlp.down_proj.weight"], Int4)
    assert isinstance(first["model.layers.3.self_attn.q_proj.weight"], Int4)
    assert isinstance(first["mtp.fc.weight"], Int4)
    assert isinstance(first["model.embed_tokens.weight"], Int8) and isinstance(first["lm_head.weight"], Int8)
    assert first["model.layers.0.linear_attn.in_proj_a.weight"].dtype == torch.float32      # kept as stored
    assert first["model.layers.0.linear_attn.conv1d.weight"].shape == (128, 1, 4)

    entry = cache.lookup(key)
    assert entry is not None and len(list(entry.path.glob("*.safetensors"))) > 1
    assert entry.manifest["source_format"] == "fp32" and cache.size_bytes() == entry.size_bytes() > 0

    def no_conversion(*args):
        raise AssertionError("a cache hit must not convert")
    monkeypatch.setattr(convert_cache, "convert", no_conversion)
    monkeypatch.setattr(convert_cache, "WeightSource", no_conversion)
    second = dict(converted_weights(path, POLICY, cache=cache))
    assert first.keys() == second.keys()
    assert all(same(first[n], second[n]) for n in first)

    cache.evict(key)
    assert cache.lookup(key) is None and cache.entries() == []


def converting(monkeypatch) -> list[str]:
    """The names convert() is called for, from now on."""
    calls, real = [], convert_cache.convert

    def counted(value, scheme, policy):
        calls.append(scheme)
        return real(value, scheme, policy)
    monkeypatch.setattr(convert_cache, "convert", counted)
    return calls


def fresh(path) -> dict:
    """The whole conversion in one go, in a cache of its own."""
    return dict(converted_weights(path, POLICY, cache=ConvertCache(Path(str(path) + "-fresh-cache"))))


def test_an_interrupted_conversion_leaves_a_miss_and_the_next_converts_only_the_rest(checkpoint, tmp_path,
                                                                                       monkeypatch):
    path = checkpoint("base")
    cache = ConvertCache(tmp_path / "cache", shard_bytes=20_000)
    key = cache_key(source_identity(path), POLICY)
    weights = converted_weights(path, POLICY, cache=cache)
    for _ in range(30):
        next(weights)
    weights.close()                                  # the loader stopped partway (an error, a cancel)
    assert cache.lookup(key) is None and cache.entries() == []
    assert [p.name for p in cache.root.iterdir()] == [f".tmp-{key}"]      # the shards written so far stay

    calls = converting(monkeypatch)
    second = dict(converted_weights(path, POLICY, cache=cache))
    total = len(second)
    assert 0 < len(calls) < total - 10               # the shards' weights were read back, not converted again
    assert cache.lookup(key) is not None and [p.name for p in cache.root.iterdir()] == [key]
    first = fresh(path)
    assert all(same(first[n], second[n]) for n in first)
    entry = cache.lookup(key)
    assert all(same(first[n], entry.read(n)) for n in first)          # the entry holds the whole conversion
    entry.close()


def test_a_failed_conversion_resumes_too(checkpoint, tmp_path, monkeypatch):
    path = checkpoint("base")
    cache = ConvertCache(tmp_path / "cache", shard_bytes=20_000)
    calls, real = [], convert_cache.convert

    def failing(value, scheme, policy):
        calls.append(1)
        if len(calls) == 40:
            raise RuntimeError("out of memory")
        return real(value, scheme, policy)
    monkeypatch.setattr(convert_cache, "convert", failing)
    with pytest.raises(RuntimeError):
        for _ in converted_weights(path, POLICY, cache=cache):
            pass
    calls.clear()
    second = dict(converted_weights(path, POLICY, cache=cache))
    assert len(calls) < len(second) - 10
    first = fresh(path)
    assert all(same(first[n], second[n]) for n in first)


def test_a_killed_process_leaves_a_miss_and_the_next_load_goes_on_from_its_shards(checkpoint, tmp_path,
                                                                                    monkeypatch):
    path = checkpoint("base")
    root = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os
        from engine.weights.convert_cache import ConvertCache, converted_weights
        from engine.weights.policy import QuantPolicy
        def die(done, total):
            if done == 30:
                os._exit(9)                          # no cleanup: like a crash or a kill
        for _ in converted_weights({str(path)!r}, QuantPolicy(group_size=32),
                                   cache=ConvertCache({str(root)!r}, shard_bytes=20_000), progress=die):
            pass
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 9, result.stderr
    key = cache_key(source_identity(path), POLICY)
    (leftover,) = root.iterdir()
    assert leftover.name == f".tmp-{key}" and list(leftover.glob("*.safetensors"))
    (leftover / "shard-09999.safetensors").write_bytes(b"half a shard")   # written after the last record
    cache = ConvertCache(root)
    assert cache.lookup(key) is None and cache.entries() == []
    calls = converting(monkeypatch)
    second = dict(converted_weights(path, POLICY, cache=cache))
    assert 0 < len(calls) < len(second) - 10
    assert cache.lookup(key) is not None and [p.name for p in root.iterdir()] == [key]
    first = fresh(path)
    assert all(same(first[n], second[n]) for n in first)


def test_progress_from_another_conversion_is_not_taken(checkpoint, tmp_path, monkeypatch):
    path = checkpoint("base")
    cache = ConvertCache(tmp_path / "cache", shard_bytes=20_000)
    key = cache_key(source_identity(path), POLICY)
    weights = converted_weights(path, POLICY, cache=cache)
    for _ in range(30):
        next(weights)
    weights.close()
    progress = cache.root / f".tmp-{key}" / "progress.json"
    progress.write_text(progress.read_text().replace('"format_version": 2', '"format_version": 1'))
    calls = converting(monkeypatch)
    second = dict(converted_weights(path, POLICY, cache=cache))
    assert len(calls) == len(second)                  # started afresh


@pytest.mark.parametrize("damage", ["truncated shard", "missing shard", "unreadable manifest"])
def test_a_damaged_entry_is_a_miss_and_is_converted_again(checkpoint, tmp_path, damage):
    path = checkpoint("base")
    cache = ConvertCache(tmp_path / "cache", shard_bytes=20_000)
    key = cache_key(source_identity(path), POLICY)
    first = dict(converted_weights(path, POLICY, cache=cache))
    shard = sorted(cache.lookup(key).path.glob("*.safetensors"))[-1]
    if damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    elif damage == "missing shard":
        shard.unlink()
    else:
        (shard.parent / "manifest.json").write_text("{not json")
    assert not cache.has(key) and cache.lookup(key) is None and cache.entries() == []    # removed: a miss
    second = dict(converted_weights(path, POLICY, cache=cache))
    assert first.keys() == second.keys() and all(same(first[n], second[n]) for n in first)
    assert cache.lookup(key) is not None


def test_the_key_follows_the_source_and_the_policy(checkpoint, tmp_path):
    path = checkpoint("wrapper_tied_sharded_bf16")
    key = cache_key(source_identity(path), POLICY)
    assert key == cache_key(source_identity(path), QuantPolicy(group_size=32))
    assert key != cache_key(source_identity(path), QuantPolicy(group_size=32, method="rtn"))
    assert key != cache_key(source_identity(path), QuantPolicy(group_size=32, mtp="float"))
    shard = sorted(path.glob("*.safetensors"))[1]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))      # the shard was replaced
    assert cache_key(source_identity(path), POLICY) != key
    commit = "0123456789abcdef0123456789abcdef01234567"
    pinned = source_identity(path, "Qwen/Qwen3.6-27B", commit)
    assert pinned == {"repo": "Qwen/Qwen3.6-27B", "revision": commit}
    assert cache_key(pinned, POLICY) == cache_key(source_identity(tmp_path, "Qwen/Qwen3.6-27B", commit), POLICY)
    assert "files" in source_identity(path, "Qwen/Qwen3.6-27B", "main")   # a branch does not identify content


def test_stored_forms_round_trip():
    g = torch.Generator().manual_seed(0)
    int4 = Int4(torch.randint(0, 16, (6, 64), generator=g, dtype=torch.uint8), torch.rand(6, 2).half(),
                torch.rand(6, 2).half() * 15)
    values = {"a.weight": int4, "b.weight": Int8(torch.randint(-127, 128, (6, 64), dtype=torch.int8),
                                                  torch.rand(6, 2).half()),
              "d.weight": torch.randn(3, 5).bfloat16()}   # act-order GPTQ never reaches the cache (convert)
    for name, value in values.items():
        kind, stored = _encode(name, value)
        assert same(_decode(kind, name, stored.__getitem__), value), name
    assert _encode("a.weight", int4)[1]["a.weight.q4"].shape == (6, 32)


def test_convert_keeps_exact_int4_and_dequantizes_it_for_other_schemes():
    g = torch.Generator().manual_seed(1)
    int4 = Int4(torch.randint(0, 16, (8, 64), generator=g, dtype=torch.uint8), torch.rand(8, 2).half(),
                torch.full((8, 2), 8.0).half())
    assert convert(int4, "int4", POLICY) is int4
    assert torch.equal(convert(int4, "float", POLICY), dequantize(int4, torch.bfloat16))
    perm = torch.randperm(64, generator=g)
    W = convert(ActOrderInt4(int4, perm), "float", POLICY)
    assert torch.equal(W[:, perm], dequantize(int4, torch.bfloat16))
    assert isinstance(convert(W.float(), "int8", POLICY), Int8)
    per_channel = Int4(torch.randint(0, 16, (8, 256), generator=g, dtype=torch.uint8),    # GPTQ group_size -1
                       torch.full((8, 1), 0.01).half(), torch.full((8, 1), 8.0).half())
    requantized = convert(per_channel, "int4", POLICY)
    assert requantized.group_size == 32
    assert torch.allclose(dequantize(requantized), dequantize(per_channel), atol=0.01)


def test_cache_root_can_be_set_by_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QWENDESK_CACHE_DIR", str(tmp_path))
    assert default_root() == tmp_path and ConvertCache().root == tmp_path
    monkeypatch.delenv("QWENDESK_CACHE_DIR")
    assert default_root().name == "converted"
