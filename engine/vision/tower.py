"""The Qwen3.5 vision tower (transformers' Qwen3_5VisionModel: Qwen3-VL's without deepstack).

patch embedding (a linear map of each C x T x P x P patch) + learned position embeddings (a square table resampled
bilinearly to each image's grid) -> blocks (LayerNorm, attention within each image with a 2D rotary of (row, column),
LayerNorm, GELU MLP) -> merger (LayerNorm, each 2 x 2 block of patches concatenated, MLP into the language model's
hidden size). Patches arrive in merge-block order (engine/vision/processor.py), so a block's four patches are
consecutive rows. The linears are engine Linears: 16-bit, or int4 / int8 where the quantization policy says.

Everything but the attention works on CHUNK_ROWS patches at a time (each row's arithmetic as in one pass), so a large
image's activations are about five [patches, hidden] tensors (the residual, q, k, v, the attention output) plus one
chunk's temporaries: the largest image (65,536 patches) needs ~0.9 GiB, not ~2.8 (engine/core/memory.py counts it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import UnsupportedModelError, VisionConfig
from engine.model.linear import Build, Linear, param
from engine.weights.checkpoint import CheckpointError

Grid = tuple[int, int, int]   # (t, h, w) in patches
GELU_APPROXIMATION = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}   # the blocks' hidden_act -> F.gelu's
CHUNK_ROWS = 4096        # patches per pass of the row-wise work (a 1024 x 1024 image: one pass)


def row_chunks(n: int) -> list[slice]:
    return [slice(i, min(i + CHUNK_ROWS, n)) for i in range(0, n, CHUNK_ROWS)]


class BiasLinear(nn.Module):
    """An engine Linear plus its bias; `name` is the checkpoint's, without `model.visual.` and `.weight`."""

    def __init__(self, in_features: int, out_features: int, build: Build, name: str):
        super().__init__()
        self.name = name
        prefix, part = name.rsplit(".", 1)
        self.linear = Linear(in_features, {part: out_features}, build, f"model.visual.{prefix}.")
        self.bias = param(build.empty(out_features))

    def forward(self, x):
        return self.linear(x) + self.bias

    def checkpoint_slices(self):
        yield from self.linear.checkpoint_slices(prefix=self.name.rsplit(".", 1)[0] + ".")
        yield f"{self.name}.bias", self.bias, 0, tuple(self.bias.shape)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, build: Build, name: str):
        super().__init__()
        self.name = name
        self.weight = param(build.empty(dim))
        self.bias = param(build.empty(dim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, eps=1e-6)

    def checkpoint_slices(self):
        yield f"{self.name}.weight", self.weight, 0, tuple(self.weight.shape)
        yield f"{self.name}.bias", self.bias, 0, tuple(self.bias.shape)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig, build: Build, prefix: str):
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.norm1 = LayerNorm(h, build, prefix + "norm1")
        self.qkv = BiasLinear(h, 3 * h, build, prefix + "attn.qkv")
        self.proj = BiasLinear(h, h, build, prefix + "attn.proj")
        self.norm2 = LayerNorm(h, build, prefix + "norm2")
        self.fc1 = BiasLinear(h, cfg.intermediate_size, build, prefix + "mlp.linear_fc1")
        self.fc2 = BiasLinear(cfg.intermediate_size, h, build, prefix + "mlp.linear_fc2")
        if cfg.hidden_act not in GELU_APPROXIMATION:
            raise UnsupportedModelError(f"the vision tower's hidden_act {cfg.hidden_act!r} is not supported "
                                        f"(one of {', '.join(GELU_APPROXIMATION)})")
        self.approximate = GELU_APPROXIMATION[cfg.hidden_act]

    def forward(self, x, cos, sin, seqlens: list[int]):
        """x [patches, hidden], updated in place and returned: x += attention; x += MLP (row chunks)."""
        n = x.shape[0]
        qkv = torch.empty(n, 3, self.num_heads, x.shape[1] // self.num_heads, dtype=x.dtype, device=x.device)
        for rows in row_chunks(n):
            qkv[rows] = self.rotated_qkv(self.norm1(x[rows]), cos[rows], sin[rows])
        out = self.attention(qkv, seqlens)
        del qkv
        for rows in row_chunks(n):
            x[rows] += self.proj(out[rows].reshape(rows.stop - rows.start, -1))
        del out
        for rows in row_chunks(n):
            x[rows] += self.fc2(F.gelu(self.fc1(self.norm2(x[rows])), approximate=self.approximate))
        return x

    def rotated_qkv(self, x, cos, sin):
        """[rows, 3, H, D]: q, k (the rotary in fp32) and v of rows x."""
        qkv = self.qkv(x).view(x.shape[0], 3, self.num_heads, -1)
        c, s = cos[:, None], sin[:, None]
        for i in (0, 1):
            t = qkv[:, i].float()
            qkv[:, i] = t * c + rotate_half(t) * s
        return qkv

    def attention(self, qkv, seqlens):
        """[patches, H, D]: attention within each image (each frame: a segment of seqlens)."""
        # [1, H, n, D]: SDPA's flash and memory-efficient kernels take 4-D inputs only
        out = [F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in part.unbind(1)))[0]
               for part in qkv.split(seqlens)]
        return (out[0] if len(out) == 1 else torch.cat(out, dim=1)).transpose(0, 1)

    def checkpoint_slices(self):
        for part in (self.norm1, self.qkv, self.proj, self.norm2, self.fc1, self.fc2):
            yield from part.checkpoint_slices()


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig, build: Build):
        super().__init__()
        self.cfg = cfg
        self.dtype = build.dtype
        h, m = cfg.hidden_size, cfg.spatial_merge_size
        patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
        self.patch_weight = param(build.empty(h, patch_dim))     # the checkpoint's Conv3d, flattened
        self.patch_bias = param(build.empty(h))
        self.pos_embed = param(build.empty(cfg.num_position_embeddings, h))
        self.side = int(cfg.num_position_embeddings ** 0.5)
        spatial = cfg.head_dim // 2            # rows and columns rotate half of the head dims each
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial)
        self.register_buffer("inv_freq", inv.to(build.device), persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(cfg, build, f"blocks.{i}.") for i in range(cfg.depth))
        self.merger_norm = LayerNorm(h, build, "merger.norm")
        self.merger_fc1 = BiasLinear(h * m * m, h * m * m, build, "merger.linear_fc1")
        self.merger_fc2 = BiasLinear(h * m * m, cfg.out_hidden_size, build, "merger.linear_fc2")

    def forward(self, pixel_values: torch.Tensor, grids: list[Grid]) -> torch.Tensor:
        """Pixel values [patches, C*T*P*P] of one or more images (any device) -> [patches / merge², out_hidden] on
        the tower's: each image's merged tokens, in order (what its placeholder tokens in the prompt take)."""
        stages = self.stages(pixel_values, grids)
        del pixel_values                    # the stages drop it after the patch embedding
        while True:
            try:
                next(stages)
            except StopIteration as done:
                return done.value

    def stages(self, pixel_values: torch.Tensor, grids: list[Grid]):
        """forward() a stage at a time: a generator that pauses after the patch embedding and after each block and
        returns the output, so that the engine can spread a large image over several steps."""
        m = self.cfg.spatial_merge_size
        rows, cols = self._patch_coordinates(grids)
        n = pixel_values.shape[0]
        x = torch.empty(n, self.cfg.hidden_size, dtype=self.dtype, device=self.patch_weight.device)
        for part in row_chunks(n):
            x[part] = F.linear(pixel_values[part].to(x.device, x.dtype), self.patch_weight, self.patch_bias)
            x[part] += self._position_embeddings(grids, rows, cols, part).to(x.dtype)
        del pixel_values
        freqs = torch.cat([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], dim=-1)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        seqlens = [h * w for t, h, w in grids for _ in range(t)]
        yield
        for block in self.blocks:
            x = block(x, cos, sin, seqlens)
            yield
        x = self.merger_norm(x).view(-1, x.shape[-1] * m * m)
        return self.merger_fc2(F.gelu(self.merger_fc1(x)))

    def _patch_coordinates(self, grids: list[Grid]) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every patch in merge-block order, each frame of an image alike; fp32."""
        m = self.cfg.spatial_merge_size
        rows, cols = [], []
        for t, h, w in grids:
            r = torch.arange(h, device=self.inv_freq.device).view(h // m, 1, m, 1).expand(h // m, w // m, m, m)
            c = torch.arange(w, device=self.inv_freq.device).view(1, w // m, 1, m).expand(h // m, w // m, m, m)
            rows.append(r.reshape(-1).repeat(t))
            cols.append(c.reshape(-1).repeat(t))
        return torch.cat(rows).float(), torch.cat(cols).float()

    def _position_embeddings(self, grids: list[Grid], rows, cols, part: slice) -> torch.Tensor:
        """The square table resampled to each grid (bilinear, corners aligned: transformers' interpolation), fp32,
        for the patches in `part`."""
        side = self.side
        heights = torch.cat([torch.full((t * h * w,), h, device=rows.device) for t, h, w in grids])[part]
        widths = torch.cat([torch.full((t * h * w,), w, device=rows.device) for t, h, w in grids])[part]
        h_taps, h_weights = _bilinear_taps(rows[part], heights, side)
        w_taps, w_weights = _bilinear_taps(cols[part], widths, side)
        index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
        return (self.pos_embed[index].float() * weight[:, :, None]).sum(1)

    def checkpoint_slices(self):
        """(name without `model.visual.`, target, first row, checkpoint shape): a parameter or a Linear."""
        cfg = self.cfg
        yield ("patch_embed.proj.weight", self.patch_weight, 0,
               (cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size))
        yield "patch_embed.proj.bias", self.patch_bias, 0, tuple(self.patch_bias.shape)
        yield "pos_embed.weight", self.pos_embed, 0, tuple(self.pos_embed.shape)
        for block in self.blocks:
            yield from block.checkpoint_slices()
        for part in (self.merger_norm, self.merger_fc1, self.merger_fc2):
            yield from part.checkpoint_slices()


def _bilinear_taps(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two taps into a `side`-long axis and their weights for positions `index` on an axis of `size`."""
    src = index * (side - 1) / torch.clamp(size - 1, min=1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return (floor.long()[:, None] + offsets).clamp(0, side - 1), weights


def load_vision_tower(cfg: VisionConfig, tensors: dict, dtype: torch.dtype, device, policy=None) -> VisionTower:
    """Build the tower and fill it from the loader's vision tensors (engine.model.load.load_model's second result: names
    without `model.visual.`, float or quantized per `policy`), emptying `tensors` on the way so the two never both
    hold all the weights. Raises CheckpointError naming missing, unexpected or wrongly shaped tensors."""
    tower = VisionTower(cfg, Build(dtype, device, policy))
    slices = list(tower.checkpoint_slices())
    missing = sorted({name for name, *_ in slices} - set(tensors))
    unexpected = sorted(set(tensors) - {name for name, *_ in slices})
    if missing or unexpected:
        problem = f"lacks {', '.join(missing[:3])}" if missing else f"has unexpected {', '.join(unexpected[:3])}"
        raise CheckpointError(f"the checkpoint's vision tower {problem}")
    with torch.no_grad():
        for name, target, row, shape in slices:
            value = tensors.pop(name)
            source_shape = tuple(value.shape if isinstance(value, torch.Tensor) else value[0].shape)
            if source_shape != shape:
                raise CheckpointError(f"vision tensor {name} has shape {list(source_shape)}, config.json implies "
                                      f"{list(shape)}")
            if isinstance(target, Linear):
                target.load_rows(row, value)
            else:
                target.copy_(value.reshape(target.shape))
    return tower.eval()
