"""What each concurrency profile means for a checkpoint on this machine: the weights it loads as, context
per request, memory, and whether it fits. Plans come from the engine's planner (engine.api.plan_for), which
reads only the checkpoint's config."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.catalog import what_limits
from app.paths import resources_dir
from engine.api import PROFILES, DeviceInfo, EngineConfig, plan_for


@dataclass(frozen=True)
class ProfilePlan:
    profile: str
    weights: str            # bf16 | int4: what the engine decided the weights load as
    fits: bool
    max_context: int
    total_bytes: int
    budget_bytes: int
    message: str
    weights_bytes: int = 0
    kv_bytes: int = 0
    state_bytes: int = 0       # recurrent state: live slots, snapshots, scratch
    workspace_bytes: int = 0   # activations, logits, graph pools (and the allocator's margin)
    vision: str = "off"     # the vision tower: off | resident | on_demand (engine.api MemoryPlan.vision)
    vision_bytes: int = 0   # what encoding the largest image holds on the GPU
    weight_bits: int = 16   # unquantized weights' bits (MemoryPlan.weight_bits: 32 on the CPU)
    limit: str = ""         # what does not fit, when it does not (catalog.what_limits)


def profile_descriptions() -> dict[str, dict]:
    data = json.loads((resources_dir() / "profiles.json").read_text(encoding="utf-8"))
    return {p["id"]: p for p in data["profiles"]}


def plan_profiles(config: EngineConfig, device: DeviceInfo | None, loaded_plan=None) -> list[ProfilePlan]:
    """Plans for every profile with `config`'s other settings on `device` (the app's probe: the figure every page
    shows; None: probe config.device now). With a model loaded, the budget is what was free before its weights
    (its plan's budget plus the weights), not what is free now."""
    budget = loaded_plan.budget_bytes + loaded_plan.weights_bytes if loaded_plan is not None else None
    plans = []
    for profile in PROFILES:
        alt = EngineConfig(**{**config.__dict__, "profile": profile})
        try:
            plan = plan_for(alt, device, budget_bytes=budget)
        except (OSError, ValueError, RuntimeError) as e:     # RuntimeError: a device this machine lacks
            plans.append(ProfilePlan(profile, config.weights, False, 0, 0, budget or 0, str(e)))
            continue
        plans.append(ProfilePlan(profile, plan.weights, plan.fits, plan.max_context, plan.total_bytes,
                                 plan.budget_bytes, plan.message, plan.weights_bytes, plan.kv_bytes, plan.state_bytes,
                                 plan.workspace_bytes + plan.margin_bytes, plan.vision, plan.vision_bytes,
                                 plan.weight_bits, "" if plan.fits else what_limits(plan)))
    return plans
