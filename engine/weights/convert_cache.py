"""Converted weights, cached on disk so that the second load of a checkpoint skips the conversion.

An entry is a directory `<root>/<key>` laid out like a sharded safetensors checkpoint (shards + index) plus
`manifest.json` (what it was converted from and how, and the kind of each weight). Its key hashes the
checkpoint's identity (repo id + commit when known, else its absolute path and each file's size and mtime),
the policy and FORMAT_VERSION. An entry is written in a temporary directory `.tmp-<key>` and renamed into place only
once complete, so an interrupted conversion leaves no entry (a miss), never half of one; the temporary directory
keeps the shards written so far with `progress.json` (what they hold), so that the next load converts only the
rest (a conversion of a 27B model takes minutes; a cancel, a crash or a closed window no longer loses them).

Stored form of one weight `name`: a float tensor as `name`; Int4 as `name.q4` (uint8 [N, K/2], low nibble
= even k), `name.scales`, `name.zeros`; Int8 as `name.q8`, `name.scales` (act-order GPTQ weights never reach the
cache: `convert` requantizes them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Generator
from typing import TypeAlias
from pathlib import Path

import platformdirs
import torch
from safetensors.torch import save_file

from engine.weights.checkpoint import CheckpointError, TensorReader, list_tensors
from engine.weights.formats import ActOrderInt4, WeightSource
from engine.weights.policy import DEFAULT_POLICY, QuantPolicy
from engine.weights.quantize import Int4, Int8, dequantize, quantize_int4, quantize_int8

FORMAT_VERSION = 2
CACHE_ENV = "QWENDESK_CACHE_DIR"
SHARD_BYTES = 1 << 30
MANIFEST = "manifest.json"
PROGRESS = "progress.json"      # in a conversion's temporary directory: the weights its shards hold so far
KERNEL_GROUP_SIZES = (32, 64, 128)      # int4 group sizes qwendesk_kernels/quant_format.pack_int4 takes

Converted: TypeAlias = torch.Tensor | Int4 | Int8      # a weight in its scheme: what the cache holds
Weight: TypeAlias = Converted | ActOrderInt4           # a source weight
Progress = Callable[[int, int], None]


def default_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(platformdirs.user_cache_dir("qwendesk", appauthor=False)) / "converted"


def source_identity(path: str | Path, repo_id: str | None = None, revision: str | None = None) -> dict:
    """What identifies a checkpoint's content: its repo and commit when `revision` is a commit hash; otherwise
    its absolute path and the name, size and mtime of each of its .safetensors / .json files."""
    if repo_id and revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return {"repo": repo_id, "revision": revision}
    path = Path(path).resolve()
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".json"))
    return {"repo": repo_id, "path": str(path),
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def cache_key(identity: dict, policy: QuantPolicy) -> str:
    blob = json.dumps({"source": identity, "policy": policy.key(), "version": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _encode(name: str, value: Converted) -> tuple[str, dict[str, torch.Tensor]]:
    """-> (kind, stored tensors)."""
    if isinstance(value, torch.Tensor):
        return "float", {name: value}
    if isinstance(value, Int8):
        return "int8", {f"{name}.q8": value.q, f"{name}.scales": value.scales}
    q = value.q
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return "int4", {f"{name}.q4": packed, f"{name}.scales": value.scales, f"{name}.zeros": value.zeros}


def _decode(kind: str, name: str, get: Callable[[str], torch.Tensor]) -> Converted:
    if kind == "float":
        return get(name)
    if kind == "int8":
        return Int8(get(f"{name}.q8"), get(f"{name}.scales"))
    packed = get(f"{name}.q4")
    q = torch.stack([packed & 15, packed >> 4], dim=2).reshape(packed.shape[0], -1)
    return Int4(q, get(f"{name}.scales"), get(f"{name}.zeros"))


class CacheEntry:
    """A complete cached conversion; weights are read one at a time. Opening one reads its manifest and checks that
    its shards hold every byte their headers declare (CheckpointError, OSError or ValueError if not)."""

    def __init__(self, path: Path):
        self.path = path
        self.manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        self._tensors = list_tensors(path)
        self._readers: dict[str, TensorReader] = {}

    @property
    def key(self) -> str:
        return self.path.name

    def names(self) -> list[str]:
        return list(self.manifest["weights"])

    def read(self, name: str, device: str = "cpu") -> Converted:
        if device not in self._readers:
            self._readers[device] = TensorReader(device)
        reader = self._readers[device]
        return _decode(self.manifest["weights"][name], name, lambda n: reader.get(self._tensors[n]))

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.iterdir())

    def close(self):
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


class CacheWriter:
    """Collects converted weights into shards in the key's temporary directory; commit() publishes them as an entry.
    Each shard written is recorded in progress.json, and a writer for the same key and meta picks them up
    (`resumed`, `read_resumed`): leaving the `with` block without commit() (an error, an interrupted load) keeps
    the shards already written."""

    def __init__(self, root: Path, key: str, meta: dict, shard_bytes: int = SHARD_BYTES):
        self.root, self.key, self.meta, self.shard_bytes = root, key, meta, shard_bytes
        for stale in root.glob(f".tmp-{key}-*"):     # an earlier version's per-run temporary directories
            shutil.rmtree(stale, ignore_errors=True)
        self.tmp = root / f".tmp-{key}"
        self.kinds: dict[str, str] = {}
        self.weight_map: dict[str, str] = {}
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffered = 0
        self._shards = 0
        self._reader: TensorReader | None = None
        self._resume()
        self.resumed = frozenset(self.kinds)          # weights converted by an earlier run, in the shards already

    def _resume(self) -> None:
        """Take over the shards an interrupted conversion of the same key and meta wrote; start afresh when there
        are none or they do not check out."""
        try:
            saved = json.loads((self.tmp / PROGRESS).read_text(encoding="utf-8"))
            if saved["meta"] != self.meta:
                raise ValueError("another conversion's progress")
            shards = {f"shard-{i:05d}.safetensors" for i in range(1, saved["shards"] + 1)}
            if set(saved["weight_map"].values()) - shards:
                raise ValueError("progress names a shard it does not count")
            for extra in set(p.name for p in self.tmp.iterdir()) - shards - {PROGRESS}:
                (self.tmp / extra).unlink()           # a shard written after the last progress record
            self._tensors = list_tensors(self.tmp)    # every shard whole (CheckpointError, OSError if not)
            if set(saved["weight_map"]) - set(self._tensors):
                raise ValueError("a shard lacks a tensor its progress lists")
        except (OSError, ValueError, KeyError, TypeError, CheckpointError):
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)
            return
        self.kinds, self.weight_map, self._shards = saved["kinds"], saved["weight_map"], saved["shards"]

    def read_resumed(self, name: str, device: str = "cpu") -> Converted:
        """A weight an earlier, interrupted run converted (name in `resumed`)."""
        if self._reader is None:
            self._reader = TensorReader(device)
        reader = self._reader
        return _decode(self.kinds[name], name, lambda n: reader.get(self._tensors[n]))

    def add(self, name: str, value: Converted) -> None:
        kind, tensors = _encode(name, value)
        self.kinds[name] = kind
        for tname, t in tensors.items():
            self._buffer[tname] = t.detach().to("cpu").contiguous()
            self._buffered += t.numel() * t.element_size()
        if self._buffered >= self.shard_bytes:
            self._flush()

    def _flush(self):
        if not self._buffer:
            return
        self._shards += 1
        fname = f"shard-{self._shards:05d}.safetensors"
        save_file(self._buffer, str(self.tmp / fname), metadata={"format": "pt"})
        self.weight_map.update(dict.fromkeys(self._buffer, fname))
        self._buffer, self._buffered = {}, 0
        record = {"meta": self.meta, "kinds": self.kinds, "weight_map": self.weight_map, "shards": self._shards}
        (self.tmp / f"{PROGRESS}.part").write_text(json.dumps(record))   # add() flushes whole weights only
        os.replace(self.tmp / f"{PROGRESS}.part", self.tmp / PROGRESS)

    def commit(self) -> CacheEntry:
        self._flush()
        self._close_reader()
        (self.tmp / PROGRESS).unlink(missing_ok=True)
        (self.tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": self.weight_map}))
        (self.tmp / MANIFEST).write_text(json.dumps({**self.meta, "weights": self.kinds}, indent=1))
        final = self.root / self.key
        try:
            os.replace(self.tmp, final)
        except OSError:
            if not (final / MANIFEST).exists():
                raise
            shutil.rmtree(self.tmp, ignore_errors=True)     # another process committed this key first
        return CacheEntry(final)

    def abort(self) -> None:
        """Throw the partial work away."""
        self._close_reader()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close_reader()             # the shards written stay, with their progress, for the next load


class ConvertCache:
    """Entries under `root` (default: QWENDESK_CACHE_DIR, else platformdirs' user cache dir / converted)."""

    def __init__(self, root: str | Path | None = None, shard_bytes: int = SHARD_BYTES):
        self.root = Path(root) if root is not None else default_root()
        self.shard_bytes = shard_bytes

    def has(self, key: str) -> bool:
        return self.lookup(key) is not None

    def lookup(self, key: str) -> CacheEntry | None:
        """The complete, readable entry for `key`, or None (a miss). An entry appears whole (its manifest is written
        last); a damaged one (a truncated or missing shard, a broken manifest: a full disk, a file removed by hand)
        is removed, so that it counts as a miss and is converted again from the checkpoint."""
        if not (self.root / key / MANIFEST).exists():
            return None
        try:
            return CacheEntry(self.root / key)
        except (CheckpointError, OSError, ValueError):
            self.evict(key)
            return None

    def writer(self, key: str, meta: dict) -> CacheWriter:
        return CacheWriter(self.root, key, meta, self.shard_bytes)

    def entries(self) -> list[CacheEntry]:
        if not self.root.exists():
            return []
        entries = (self.lookup(p.name) for p in sorted(self.root.iterdir()))
        return [e for e in entries if e is not None]

    def size_bytes(self) -> int:
        return sum(e.size_bytes() for e in self.entries())

    def evict(self, key: str) -> None:
        shutil.rmtree(self.root / key, ignore_errors=True)


def convert(value: Weight, scheme: str, policy: QuantPolicy) -> Converted:
    """One source weight -> the policy's scheme. Exact int4 sources (GPTQ / AWQ) stay as they are when the
    scheme is int4 and the kernels take their group size; otherwise (act-order ones included: the kernels
    have no column permutation) they are dequantized first."""
    if isinstance(value, (Int4, ActOrderInt4)):
        if scheme == "int4" and isinstance(value, Int4) and value.group_size in KERNEL_GROUP_SIZES:
            return value
        value = _dequantize_source(value)
    if scheme == "int4":
        return quantize_int4(value, policy.group_size, policy.method)
    if scheme == "int8":
        return quantize_int8(value, policy.group_size)
    return value


def _dequantize_source(value: Int4 | ActOrderInt4) -> torch.Tensor:
    if isinstance(value, Int4):
        return dequantize(value, torch.bfloat16)
    permuted = dequantize(value.weight, torch.bfloat16)
    out = torch.empty_like(permuted)
    out[:, value.perm] = permuted
    return out


def converted_weights(path: str | Path, policy: QuantPolicy = DEFAULT_POLICY, device: str = "cpu",
                      cache: ConvertCache | None = None, identity: dict | None = None,
                      progress: Progress | None = None) -> Generator[tuple[str, Converted], None, None]:
    """(checkpoint name, weight) for every logical weight of the checkpoint at `path`, converted per `policy`,
    one at a time on `device`. Read from the cache on a hit; on a miss converted from the checkpoint and
    written to the cache on the way (the entry appears only after the last weight). progress(done, total)."""
    cache = cache or ConvertCache()
    identity = identity or source_identity(path)
    key = cache_key(identity, policy)
    entry = cache.lookup(key)
    if entry is not None:
        names = entry.names()
        try:
            for done, name in enumerate(names, 1):
                yield name, entry.read(name, device)
                if progress:
                    progress(done, len(names))
        finally:
            entry.close()
        return
    source = WeightSource(path, device)
    meta = {"key": key, "format_version": FORMAT_VERSION, "source": identity,
            "source_format": source.format.kind, "policy": policy.key()}
    try:
        with cache.writer(key, meta) as writer:
            for done, (name, shape) in enumerate(source.shapes.items(), 1):
                if name in writer.resumed:               # converted before an interruption: read back
                    value = writer.read_resumed(name, device)
                else:
                    value = convert(source.read(name), policy.scheme(name, shape), policy)
                    writer.add(name, value)
                yield name, value
                if progress:
                    progress(done, len(source.shapes))
            writer.commit()
    finally:
        source.close()
