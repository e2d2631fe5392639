"""The model catalog (resources/catalog.json), what each entry runs as on this machine, and the recommendation.

What an entry runs as (16-bit or int4 weights, how much context) is the engine's decision (engine.api.plan_for),
made from the entry's architecture before anything is downloaded, exactly as the engine will make it at load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.formatting import human_memory, weights_words
from app.paths import resources_dir
from engine.api import DeviceInfo, MemoryPlan, ModelConfig, parse_model_config

USEFUL_CONTEXT = 32768      # a recommendation must leave at least this much context at C1


@dataclass(frozen=True)
class CatalogEntry:
    id: str              # Hugging Face repository id
    name: str
    variant: str         # FP8 | BF16
    params: str          # the size, also the key of its architecture
    download_gb: float
    summary: str
    recommend: bool      # a candidate for the recommendation
    source: str          # where the repository id was confirmed
    architecture: ModelConfig
    drafter: str = ""    # a block drafter made for it (Hugging Face repository id; "": none known)
    drafter_gb: float = 0.0
    drafter_source: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} {self.variant}"


def load_catalog() -> list[CatalogEntry]:
    data = json.loads((resources_dir() / "catalog.json").read_text(encoding="utf-8"))
    architectures = {size: parse_model_config(raw) for size, raw in data["architectures"].items()}
    return [CatalogEntry(**entry, architecture=architectures[entry["params"]]) for entry in data["models"]]


def too_large(device: DeviceInfo) -> str:
    return "Too large for this GPU" if device.on_gpu else "Too large for this computer"


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def what_limits(plan: MemoryPlan) -> str:
    """Why a plan does not fit, by the part that does not: the weights, the working memory beside them (activations,
    the vision tower while it encodes), or what is left for the KV cache."""
    fixed = plan.weights_bytes + plan.workspace_bytes + plan.margin_bytes + plan.state_bytes
    if plan.weights_bytes > plan.budget_bytes:
        return f"the weights alone take {human_memory(plan.weights_bytes)}"
    if fixed > plan.budget_bytes:
        tower = " with the vision tower" if plan.vision != "off" else ""
        return (f"weights {human_memory(plan.weights_bytes)} and working memory{tower} "
                f"{human_memory(plan.workspace_bytes)}")
    return f"the KV cache for {plan.max_context // 1024}K tokens of context does not fit beside the weights"


def runs_as(plan: MemoryPlan, device: DeviceInfo) -> str:
    """What a plan means, in a few words for a card."""
    if not plan.fits:
        return f"Needs {gib(plan.total_bytes)} of {gib(plan.budget_bytes)} available: {what_limits(plan)}"
    where = "" if device.on_gpu else " on the CPU"
    return (f"Runs as {weights_words(plan.weights, plan.weight_bits)}{where} ({human_memory(plan.weights_bytes)} of "
            f"weights) with up to "
            f"{plan.max_context // 1024}K tokens of context"
            + (f" ({plan.kv_dtype} KV cache)" if plan.kv_dtype.quantized else ""))


def fit_text(plan: MemoryPlan, device: DeviceInfo) -> str:
    """runs_as, saying first when the model is too large (where no badge says it)."""
    return runs_as(plan, device) if plan.fits else f"{too_large(device)}. {runs_as(plan, device)}"


def by_fit(catalog: list[CatalogEntry], plans: dict[str, MemoryPlan], recommended: CatalogEntry) -> list[CatalogEntry]:
    """The recommendation first, then what fits this machine in the catalog's order (best first), then what does
    not, smallest first."""
    return sorted(catalog, key=lambda e: (e is not recommended, not plans[e.id].fits,
                                          0 if plans[e.id].fits else plans[e.id].total_bytes))


def recommend(catalog: list[CatalogEntry], plans: dict[str, MemoryPlan], device: DeviceInfo) -> CatalogEntry:
    """The best recommendable entry (the catalog lists the best first) whose plan fits this GPU with a useful
    context; without a GPU, or when none does, the smallest one."""
    candidates = [e for e in catalog if e.recommend]
    if device.on_gpu:
        for entry in candidates:
            plan = plans[entry.id]
            if plan.fits and plan.max_context >= USEFUL_CONTEXT:
                return entry
    return min(candidates, key=lambda e: plans[e.id].weights_bytes)
