"""Reading a Hugging Face safetensors checkpoint: which files, which tensors, checked headers.

Supports one `model.safetensors` or shards listed by `model.safetensors.index.json`. Headers are
read and checked before any tensor data is touched, so a truncated or missing file is reported up
front with its name, rather than as a crash halfway through loading.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

class CheckpointError(ValueError):
    pass


TEXT_PREFIXES = ("model.language_model.", "model.")
VISION_PREFIXES = ("model.visual.", "visual.")


def canonical_name(name: str) -> tuple[str, str]:
    """-> (kind, name without the model prefix); kind is text, mtp, vision or lm_head."""
    if name.startswith("mtp."):
        return "mtp", name
    if name == "lm_head.weight":
        return "text", name
    for p in VISION_PREFIXES:
        if name.startswith(p):
            return "vision", name[len(p):]
    for p in TEXT_PREFIXES:
        if name.startswith(p):
            return "text", name[len(p):]
    return "other", name


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_header(file: Path) -> dict:
    """The safetensors JSON header, after checking the file holds all the bytes it declares."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{file.name} is truncated ({size} bytes): not a complete safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise CheckpointError(f"{file.name} is truncated: its header needs {n} bytes, the file has {size}")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{file.name} is not a safetensors file (unreadable header)") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise CheckpointError(
            f"{file.name} is truncated: {size} bytes on disk, {8 + n + end} expected "
            f"(an interrupted download? delete it and download again)")
    return header


def list_tensors(path: str | Path) -> dict[str, TensorInfo]:
    """All tensors of the checkpoint at `path`, by name, with their file, dtype and shape."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (path / f).exists()]
        if missing:
            raise CheckpointError(f"checkpoint {path} is missing shard file(s): {', '.join(missing)}")
    elif (path / "model.safetensors").exists():
        weight_map, files = None, ["model.safetensors"]
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
        weight_map = None
        if not files:
            raise CheckpointError(f"no *.safetensors weights in {path}")
    tensors: dict[str, TensorInfo] = {}
    for fname in files:
        header = read_header(path / fname)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = TensorInfo(name, path / fname, meta["dtype"], tuple(meta["shape"]))
    if weight_map:
        absent = [n for n, f in weight_map.items() if n not in tensors]
        if absent:
            raise CheckpointError(f"index lists {len(absent)} tensor(s) its shards do not hold, e.g. {absent[0]}")
    return tensors


def check_checkpoint(path: str | Path) -> None:
    """Whether the checkpoint at `path` is whole, from its index and headers alone (no tensor data is
    read): raises CheckpointError saying which file is missing, truncated or unreadable."""
    try:
        list_tensors(path)
    except OSError as e:                    # a dangling link (an interrupted hub cache), no permission
        name = Path(e.filename).name if e.filename else str(path)
        raise CheckpointError(f"{name} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} has a malformed index or header") from None


class TensorReader:
    """Opens each shard once and hands out single tensors on the requested device."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._open: dict[Path, object] = {}

    def get(self, info: TensorInfo):
        return self._handle(info).get_tensor(info.name)

    def get_slice(self, info: TensorInfo, index: int, rows: slice):
        """tensor[index, rows], reading only those bytes (one expert of a fused MoE tensor)."""
        return self._handle(info).get_slice(info.name)[index, rows]

    def _handle(self, info: TensorInfo):
        handle = self._open.get(info.file)
        if handle is None:
            handle = self._open[info.file] = safe_open(str(info.file), framework="pt", device=self.device)
        return handle

    def close(self):
        self._open.clear()
