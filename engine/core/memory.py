"""Memory plan: what the weights, the KV pages, the GDN state slots and the working buffers take,
and whether that fits the device.

The concurrency profile C splits the budget: every running sequence may reach `max_context`
tokens, so the KV pool holds C * max_context tokens (plus up to a quarter more where memory is
left over, for cached prefixes), and the state pool holds C live slots, snapshots for prefix
reuse and one scratch slot.
`plan_for` works from the model's config alone (no weights loaded), so the app can show what a
profile means, and whether the weights load as 16-bit or int4, before anything is loaded or downloaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from engine.model.config import ModelConfig, load_model_config
from engine.model.drafter_config import (DrafterConfig, check_drafter, drafter_kv_bytes_per_token,
                                         drafter_ring_bytes_per_slot,
                                         drafter_tensor_shapes, read_drafter_config)
from engine.core.device import DeviceInfo, host_ram_bytes, probe, resolve_dtype
from engine.cache.disk import MAX_PENDING_BYTES
from engine.model.shapes import model_tensor_shapes, vision_tensor_shapes
from engine.cache.kv_format import KVFormat
from engine.core.params import KV_DTYPES, PROFILES, EngineConfig, one_of
from engine.vision.tower import CHUNK_ROWS
from engine.weights.policy import policy_bytes

GIB = 1 << 30
PREFIX_EXTRA = 1.25          # at most this many KV pages per reserved page (the rest: cached prefixes)
MAX_SNAPSHOTS = 16
HOST_CACHE_DEFAULT = (8 * GIB, 0.25)     # the host tier's default budget: min(8 GiB, a quarter of RAM)


@dataclass
class MemoryPlan:
    budget_bytes: int            # what the device offers (free memory, or a simulated budget)
    weights_bytes: int
    kv_bytes: int
    state_bytes: int             # live slots + snapshots + scratch
    workspace_bytes: int         # activations of a prefill chunk, logits, CUDA graph pools (speculation's included)
    margin_bytes: int            # allocator slack / fragmentation
    max_context: int
    num_pages: int
    num_slots: int
    snapshots: int
    kv_bytes_per_token: int
    kv_dtype: KVFormat          # the KV format (config.kv_dtype, "auto" decided); equal to its name
    state_bytes_per_slot: int
    weights: str = "bf16"       # bf16 (16-bit) | int4: what the weights are loaded as
    weight_bits: int = 16        # bits of each weight left unquantized: the activation dtype's (32 on the CPU)
    drafts: int = 0              # most drafts per speculative round (0: none: no MTP module, no drafter)
    method: str = "off"          # how they are drafted: mtp | dflash (a block drafter, planned in) | off
    speculation_bytes: int = 0   # of the workspace: each running sequence's verify rows and round logits
    vision: str = "off"          # the vision tower: off | resident (its weights in weights_bytes) | on_demand (on the
    #                              GPU only while encoding: its weights are in the workspace, which the two share)
    vision_bytes: int = 0        # what encoding the largest image takes on the GPU: tower weights + its activations
    host_cache_bytes: int = 0    # the host-RAM tier's budget (host memory: not in total_bytes)
    disk_staging_bytes: int = 0  # host memory the disk tier stages its writes in (pinned on a GPU; not in total_bytes)
    fits: bool = True
    message: str = ""
    alternatives: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.state_bytes + self.workspace_bytes
                + self.margin_bytes)

    def summary(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        return (f"weights {g(self.weights_bytes)}, KV {g(self.kv_bytes)} ({self.max_context} tokens x "
                f"{self.num_pages} pages), GDN state {g(self.state_bytes)} ({self.num_slots} slots), "
                f"workspace {g(self.workspace_bytes)}, margin {g(self.margin_bytes)}: "
                f"{g(self.total_bytes)} of {g(self.budget_bytes)}"
                + (f"; speculation ({self.drafts} drafts{', block drafter' if self.method == 'dflash' else ''}) "
                   f"{g(self.speculation_bytes)} of the workspace"
                   if self.drafts else "")
                + (f"; vision tower {self.vision.replace('_', ' ')}, {g(self.vision_bytes)} while encoding"
                   if self.vision != "off" else "")
                + (f"; host-RAM cache tier of {g(self.host_cache_bytes)} (pinned at load on a GPU)"
                   if self.host_cache_bytes else "")
                + (f"; disk tier's write staging {g(self.disk_staging_bytes)} of host memory"
                   if self.disk_staging_bytes else ""))


def host_cache_bytes(config: EngineConfig) -> int:
    """The host tier's budget: config.host_cache_gb, or by default min(8 GiB, a quarter of RAM)."""
    if config.host_cache_gb is not None:
        return int(config.host_cache_gb * GIB)
    cap, share = HOST_CACHE_DEFAULT
    return min(cap, int(host_ram_bytes() * share))


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, mtp: bool, kv: KVFormat = KVFormat.BF16) -> int:
    """K and V of every full-attention layer (the MTP layer's too when it is loaded), with their scales."""
    layers = len(cfg.full_attention_layers) + (1 if mtp else 0)
    return layers * cfg.num_kv_heads * kv.bytes_per_head_token(cfg.head_dim, dtype)


def state_bytes_per_slot(cfg: ModelConfig, dtype: torch.dtype) -> int:
    conv = (cfg.conv_kernel - 1) * cfg.conv_dim * dtype.itemsize
    ssm = cfg.linear_num_v_heads * cfg.linear_k_head_dim * cfg.linear_v_head_dim * 4
    return len(cfg.linear_attention_layers) * (conv + ssm)


# Triton's autotuner times each config after clearing L2 with a 256 MiB buffer it allocates for the purpose. The
# engine's warm-up tunes kernels (fla's, the int4 GEMV's) while a prefill chunk's activations are live, on the
# first start after an install (the results are cached on disk): a 24 GiB plan without it peaked 0.07 GiB above
# its prediction on a fresh Triton cache (docs/performance.md, eighth session).
AUTOTUNE_BYTES = 256 * (1 << 20)


def mlp_activation_bytes(cfg: ModelConfig, itemsize: int) -> int:
    """Per token of a prefill chunk: the dense MLP's gate|up output; in an MoE layer (engine/model/moe.py) the
    routed rows (a copy of the token per pair, their gate|up, SwiGLU and output rows: k pairs, k + 1 with the shared
    expert stacked as expert E), the router's fp32 probabilities (sorted: three copies) and the gate|up of a shared
    expert of its own."""
    if not cfg.is_moe:
        return 2 * cfg.intermediate_size * itemsize
    pairs = cfg.num_experts_per_tok + cfg.shared_expert_stacked
    routed = pairs * (2 * cfg.hidden_size + 3 * cfg.moe_intermediate_size)
    shared = 0 if cfg.shared_expert_stacked else 2 * cfg.shared_expert_intermediate_size
    return (routed + shared) * itemsize + 3 * cfg.num_experts * 4


def workspace_bytes(cfg: ModelConfig, dtype: torch.dtype, prefill_chunk: int, max_batch: int) -> int:
    """Peak activations of one prefill chunk (the MLP's dominate: mlp_activation_bytes), fp32 logits of a
    decode batch, the decode graphs' pools, and Triton's autotuning buffer (AUTOTUNE_BYTES)."""
    it = dtype.itemsize
    chunk = prefill_chunk * (mlp_activation_bytes(cfg, it) + 6 * cfg.hidden_size * it
                             + (cfg.conv_dim + cfg.linear_value_dim) * 4)
    logits = max(max_batch, 1) * cfg.vocab_size * 4 * 3
    return chunk + logits + 256 * (1 << 20) + AUTOTUNE_BYTES


def speculation_bytes(cfg: ModelConfig, dtype: torch.dtype, drafts: int, max_batch: int,
                      drafter: DrafterConfig | None = None, prefill_chunk: int = 0) -> int:
    """What speculation adds per round, for max_batch sequences: each GDN layer's verify rows (raw row, fp32 conv
    outputs, g and beta per row: O(k), never a copy of the state), and the k + 1 rows of fp32 logits (with the
    probabilities of sampled rounds: three copies); with a block drafter, a prefill chunk's tapped features and
    their context rows, and each block's activations."""
    if not drafts:
        return 0
    rows = max_batch * (drafts + 1)
    per_row = cfg.conv_dim * (dtype.itemsize + 4) + 2 * cfg.linear_num_v_heads * 4
    total = len(cfg.linear_attention_layers) * rows * per_row + rows * cfg.vocab_size * 4 * 3
    if drafter is not None:
        taps = len(drafter.target_layer_ids) + 1
        block = max_batch * drafter.block_size * (6 * drafter.hidden_size + 3 * drafter.intermediate_size)
        total += (prefill_chunk * taps * cfg.hidden_size + block) * dtype.itemsize
    return total


# The official checkpoints' preprocessor_config.json: images are resized to at most this many pixels.
DEFAULT_MAX_PIXELS = 16_777_216
ON_DEMAND_UP_TO = 24 * GIB + GIB // 2   # cards of this much memory or less keep the tower on the host (auto)


@dataclass(frozen=True)
class VisionCost:
    """The vision tower's share of a plan: where it lives and what it needs on the GPU."""
    placement: str               # off | resident | on_demand
    weights_bytes: int = 0       # the tower's weights (16-bit or per the policy)
    encode_bytes: int = 0        # activations of encoding the largest image (max_pixels) plus its embeddings


def vision_placement(cfg: ModelConfig, config: EngineConfig, device: DeviceInfo) -> str:
    """off without a tower or when turned off; resident on the CPU (there is no other memory to keep it in); auto:
    on demand on cards of 24 GiB or less (the reference engines' choice: an image costs no context), else resident."""
    if cfg.vision is None or config.vision == "off":
        return "off"
    if not device.on_gpu:
        return "resident"
    if config.vision == "auto":
        card = device.total_bytes if config.gpu_memory_gb is None else min(device.total_bytes,
                                                                            int(config.gpu_memory_gb * GIB))
        return "on_demand" if card <= ON_DEMAND_UP_TO else "resident"
    return config.vision


def vision_encode_bytes(cfg: ModelConfig, dtype: torch.dtype, max_pixels: int) -> int:
    """Peak activations of the tower over one image of max_pixels (engine/vision/tower.py works in chunks of
    CHUNK_ROWS patches, the attention apart): in a block, the residual, q, k, v and the attention output of every
    patch, or the first four and one chunk's projection with its fp32 rotary copies; in the patch embedding, the
    fp32 pixels and the residual, and one chunk's pixels and fp32 position taps; the rotary tables throughout; plus
    the merged embeddings the prompt's rows take."""
    v = cfg.vision
    assert v is not None, "only a model with a vision tower encodes images"
    patches = max_pixels // v.patch_size ** 2
    chunk, it, h = min(patches, CHUNK_ROWS), dtype.itemsize, v.hidden_size
    pixels = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    block = max(5 * patches * h * it, 4 * patches * h * it + chunk * h * (4 * it + 5 * 4))
    embed = patches * (pixels * 4 + h * it) + chunk * (pixels * it + h * (3 * it + 10 * 4))
    rotary = 2 * patches * (h // v.num_heads) * 4
    return max(block, embed) + rotary + patches // v.spatial_merge_size ** 2 * cfg.hidden_size * it


def vision_cost(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype, device: DeviceInfo,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> VisionCost:
    placement = vision_placement(cfg, config, device)
    if placement == "off":
        return VisionCost("off")
    weights = sum(torch.Size(shape).numel() * dtype.itemsize for shape in vision_tensor_shapes(cfg.vision).values())
    return VisionCost(placement, weights, vision_encode_bytes(cfg, dtype, max_pixels))


def model_drafts(config: EngineConfig, on_gpu: bool, has_mtp: bool, drafter: DrafterConfig | None) -> int:
    """Drafts per round the engine will use: the config's (or the device's default), if the model has an MTP module
    or a drafter (the planner asks of the checkpoint's config and config.drafter, the engine of what it loaded)."""
    block = drafter.block_size if drafter is not None else None
    return config.drafts(on_gpu, config.method(has_mtp, drafter is not None), block)


def plan_memory(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype, *, weights_bytes: int,
                budget_bytes: int, drafts: int, on_gpu: bool, explain: bool = True,
                vision: VisionCost = VisionCost("off"), drafter: DrafterConfig | None = None) -> MemoryPlan:
    """The largest plan for this profile that fits `budget_bytes`, or one marked fits=False with
    a message saying what would fit. weights_bytes: the language model's; a resident vision tower adds its own. The
    tower encodes between forward passes, so its activations (and its weights, on demand) share the workspace.
    drafter: the block drafter the engine drafts with (its context K / V and workspace planned in; None: none)."""
    C, page = config.max_running, config.page_size
    one_of("kv_dtype", config.kv_dtype, KV_DTYPES)
    if config.kv_dtype == "auto":
        return _plan_auto_kv(cfg, config, dtype, weights_bytes=weights_bytes, budget_bytes=budget_bytes,
                             drafts=drafts, on_gpu=on_gpu, explain=explain, vision=vision, drafter=drafter)
    if drafter is not None:
        check_drafter(drafter, cfg)
    kv = KVFormat(config.kv_dtype)
    per_tok = kv_bytes_per_token(cfg, dtype, drafts > 0 and drafter is None, kv) + \
        (drafter_kv_bytes_per_token(drafter, kv, dtype) if drafter is not None else 0)
    per_slot = state_bytes_per_slot(cfg, dtype) + \
        (drafter_ring_bytes_per_slot(drafter, kv, dtype, page) if drafter is not None else 0)
    spec = speculation_bytes(cfg, dtype, drafts, C, drafter, config.prefill_chunk)
    work = workspace_bytes(cfg, dtype, config.prefill_chunk, C) + spec
    on_demand = vision.placement == "on_demand"
    work = max(work, vision.encode_bytes + (vision.weights_bytes if on_demand else 0))
    lm_weights = weights_bytes
    if vision.placement == "resident":
        weights_bytes += vision.weights_bytes
    margin = max(GIB // 2, budget_bytes // 40) if on_gpu else 0
    left = budget_bytes - weights_bytes - work - margin - (C + 1) * per_slot
    snapshots = config.snapshots if config.snapshots is not None else \
        max(0, min(MAX_SNAPSHOTS, int(left * 0.1) // max(per_slot, 1)))
    kv_left = left - snapshots * per_slot
    fits_ctx = max(0, int(kv_left / C / per_tok) // page * page)
    limit = cfg.max_position_embeddings
    if config.max_context is not None and config.max_context > limit:
        raise ValueError(f"max_context {config.max_context} exceeds the model's {limit} positions")

    def make(ctx: int) -> MemoryPlan:
        pages = C * -(-ctx // page) + 1
        spare = max(0, int(kv_left // (page * per_tok)) - pages)   # pages beyond the reservations: cached prefixes
        pages += min(spare, int(pages * (PREFIX_EXTRA - 1)))
        return MemoryPlan(budget_bytes=budget_bytes, weights_bytes=weights_bytes, kv_bytes=pages * page * per_tok,
                          state_bytes=(C + snapshots + 1) * per_slot, workspace_bytes=work, margin_bytes=margin,
                          max_context=ctx, num_pages=pages, num_slots=C + snapshots + 1, snapshots=snapshots,
                          kv_bytes_per_token=per_tok, kv_dtype=kv, state_bytes_per_slot=per_slot,
                          drafts=drafts, method="dflash" if drafter is not None else "mtp" if drafts else "off",
                          speculation_bytes=spec, vision=vision.placement, weight_bits=dtype.itemsize * 8,
                          vision_bytes=vision.weights_bytes + vision.encode_bytes if vision.placement != "off" else 0,
                          host_cache_bytes=host_cache_bytes(config),
                          disk_staging_bytes=MAX_PENDING_BYTES if config.disk_cache else 0)

    if config.max_context is not None:
        ctx = config.max_context
    else:
        ctx = max(min(limit, fits_ctx), page)
        while ctx > page and make(ctx).total_bytes > budget_bytes:   # page rounding can overshoot a little
            ctx -= page
    plan = make(ctx)
    if plan.total_bytes > budget_bytes or fits_ctx < page:
        plan.fits = False
        if not explain:
            return plan
        plan.alternatives = _alternatives(cfg, config, dtype, lm_weights, budget_bytes, drafts, on_gpu, vision,
                                          drafter)
        need = plan.total_bytes / GIB
        plan.message = (f"profile {config.profile} with {ctx} tokens of context needs {need:.1f} GiB; "
                        f"{budget_bytes / GIB:.1f} GiB are available. "
                        + ("What fits: " + "; ".join(plan.alternatives) if plan.alternatives
                           else "Nothing fits: the weights alone need "
                                f"{weights_bytes / GIB:.1f} GiB (try int4 weights)"))
    return plan


def _plan_auto_kv(cfg, config, dtype, **kwargs) -> MemoryPlan:
    """kv_dtype="auto": the most precise KV format whose plan reaches config.max_context (None: the model's limit);
    where none does, the smallest format's plan (the longest context, or the refusal saying what fits)."""
    for kv in KVFormat:
        plan = plan_memory(cfg, dataclasses.replace(config, kv_dtype=kv.value), dtype,
                           **{**kwargs, "explain": kwargs["explain"] and kv is list(KVFormat)[-1]})
        if plan.fits and (config.max_context is not None or plan.max_context >= cfg.max_position_embeddings):
            return plan
    return plan


def _alternatives(cfg, config, dtype, weights_bytes, budget_bytes, drafts, on_gpu, vision, drafter) -> list[str]:
    out = []
    for profile in PROFILES:
        for kv in KVFormat:
            alt = EngineConfig(**{**config.__dict__, "profile": profile, "kv_dtype": kv.value, "max_context": None})
            p = plan_memory(cfg, alt, dtype, weights_bytes=weights_bytes, budget_bytes=budget_bytes, drafts=drafts,
                            on_gpu=on_gpu, explain=False, vision=vision, drafter=drafter)
            if p.fits and p.max_context >= 1024:
                out.append(f"{profile} with {kv} KV: up to {p.max_context} tokens")
    return out


def system_share(device: DeviceInfo) -> int:
    """What a plan on the CPU leaves of the available RAM to the rest of the machine (the desktop, a browser):
    a tenth of the RAM, at least 1 GiB. A GPU's free memory already excludes what the desktop holds; its
    plans keep a margin instead (plan_memory)."""
    return 0 if device.on_gpu else max(GIB, device.total_bytes // 10)


def budget_for(config: EngineConfig, device: DeviceInfo, held_bytes: int = 0) -> int:
    """Bytes the engine may plan with: what the device offers less the system's share, capped by
    config.gpu_memory_gb (less `held_bytes`, what this process already holds, so that a simulated card counts the
    weights already loaded). The one memory figure: the engine, and every page of the app, plan with it."""
    offered = max(0, device.free_bytes - system_share(device))
    if config.gpu_memory_gb is None:
        return offered
    return min(offered, int(config.gpu_memory_gb * GIB) - held_bytes)


def weight_bytes(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype, weights: str, drafts: int,
                 drafter: DrafterConfig | None = None) -> int:
    """Device bytes of the language model's weights (MTP only when it drafts; `drafter`'s, the block drafter it drafts
    with, under the same policy; the vision tower is VisionCost's) under `weights` (bf16: 16-bit, or int4 per the
    default policy), from the model's tensor shapes."""
    shapes = dict(model_tensor_shapes(cfg, with_mtp=drafts > 0 and drafter is None, with_vision=False))  # (cached)
    if drafter is not None:
        shapes.update({f"drafter.{name}": shape for name, shape in drafter_tensor_shapes(drafter).items()})
    if weights == "int4":
        return policy_bytes(shapes, config.policy("int4"))["total"]
    # a tensor listed at 16 bits takes the activation dtype; fp32 ones (A_log, ...) stay fp32
    return sum(torch.Size(shape).numel() * (dtype.itemsize if size == 2 else size) for shape, size in shapes.values())


def checkpoint_max_pixels(path: str) -> int:
    """The checkpoint's own max_pixels (its preprocessor_config.json), else the official checkpoints' value."""
    from engine.vision.processor import load_processor_config
    try:
        return load_processor_config(path).max_pixels
    except (OSError, ValueError):
        return DEFAULT_MAX_PIXELS


def plan_for(config: EngineConfig, device: DeviceInfo | None = None, budget_bytes: int | None = None,
             model: ModelConfig | None = None) -> MemoryPlan:
    """The plan the engine will load with, from the model's config alone (nothing loaded). This is where
    `weights="auto"` is decided: 16-bit weights when their plan fits, else int4 (on a GPU); the plan says which
    (`plan.weights`). device: the device's memory (default: probe config.device now); budget_bytes: plan with this
    instead; model: the architecture when config.model is not a checkpoint on disk (a catalog entry)."""
    device = device or probe(config.device)
    dtype = resolve_dtype(config.dtype, device.kind)
    cfg = model or load_model_config(config.model)
    budget = budget_bytes if budget_bytes is not None else budget_for(config, device)
    choices = [config.weights] if config.weights != "auto" else ["bf16", "int4"] if device.on_gpu else ["bf16"]
    config.policy(choices[0])                                  # refuses an unknown weights setting
    vision = vision_cost(cfg, config, dtype, device, checkpoint_max_pixels(config.model))
    # speculation "auto" with a drafter: the drafter if it fits, else the MTP head (this is where that is decided)
    tries = [config] + ([dataclasses.replace(config, drafter=None)] if config.drafter and config.speculation == "auto"
                        else [])
    refusal = None
    for attempt in tries:
        has_mtp = cfg.num_mtp_layers > 0
        drafter = read_drafter_config(attempt.drafter) if attempt.drafter else None
        drafts = model_drafts(attempt, device.on_gpu, has_mtp=has_mtp, drafter=drafter)
        if not drafts or attempt.method(has_mtp, drafter is not None) != "dflash":
            drafter = None                                      # named, but not drafted with
        for weights in choices:
            plan = plan_memory(cfg, attempt, dtype, budget_bytes=budget, drafts=drafts, on_gpu=device.on_gpu,
                               weights_bytes=weight_bytes(cfg, attempt, dtype, weights, drafts, drafter),
                               explain=weights == choices[-1], vision=vision, drafter=drafter)
            plan.weights = weights
            if plan.fits:
                return plan
        refusal = refusal or plan
    assert refusal is not None          # tries and choices are never empty
    return refusal
