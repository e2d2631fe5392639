"""App settings: engine, generation defaults, endpoints, model folders; saved in the store.

Secrets (HF token, API keys) are kept out of repr() so they never reach a log line.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

from engine.api import DEFAULT_PORT, EngineConfig, SamplingParams

SETTINGS_KEY = "app_settings"

ENDPOINT_FIELDS = ("endpoint_enabled", "endpoint_host", "endpoint_port", "endpoint_api_key", "endpoint_special_tokens")
REMOTE_FIELDS = ("remote_enabled", "remote_base_url", "remote_api_key", "remote_model")

# what a conversation outgrowing the context does (app/chat/context_fit.py), in the words Settings shows
CONTEXT_POLICIES = {"truncate": "Leave out the oldest messages", "stop": "Stop and ask"}

# special-token text in the endpoint's clients' messages (engine.server's --special-tokens), as Settings says it
SPECIAL_TOKENS = {"auto": "Automatic: plain text unless the host is this computer", "text": "Always plain text",
                  "control": "Control tokens (trusted clients only)"}

# reasoning effort -> thinking tokens before </think> is forced (None: no limit)
THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": None}


def default_of(cls, name: str):
    """The default of an engine dataclass's field (EngineConfig, SamplingParams): the app's setting of the same name
    starts from it, so that the engine's default is defined once."""
    default = cls.__dataclass_fields__[name].default
    assert default is not MISSING, f"{cls.__name__}.{name} has no plain default"
    return default


@dataclass
class AppSettings:
    # engine: the EngineConfig fields the app lets one change, under their names (engine_config passes each on)
    device: str = default_of(EngineConfig, "device")                # auto | cuda | cpu
    weights: str = default_of(EngineConfig, "weights")              # auto (16-bit if it fits, else int4) | bf16 | int4
    profile: str = default_of(EngineConfig, "profile")
    kv_dtype: str = default_of(EngineConfig, "kv_dtype")            # KV_DTYPES: bf16 | int8 | k8v4 | k4v4 | auto
    max_context: int | None = default_of(EngineConfig, "max_context")    # None: as much as memory allows
    speculative_tokens: int | None = default_of(EngineConfig, "speculative_tokens")   # None: the engine decides
    speculation: str = default_of(EngineConfig, "speculation")      # SPECULATION: auto | mtp | dflash | off
    drafters: dict[str, str] = field(default_factory=dict)   # a checkpoint folder -> its block drafter's folder
    # generation defaults: the app's own for chat, near Qwen's recommended sampling (the engine's SamplingParams
    # defaults are neutral: temperature 1, no top-p / top-k, 256 tokens); the rest as SamplingParams has them
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = default_of(SamplingParams, "min_p")
    presence_penalty: float = default_of(SamplingParams, "presence_penalty")
    max_tokens: int = 4096
    thinking: bool = True
    reasoning_effort: str = "high"       # low | medium | high
    system_prompt: str = ""
    context_policy: str = "truncate"     # a conversation outgrowing the context: truncate (leave out its oldest
    #                                      turns) | stop (say so, with the choices, and send nothing)
    # the local endpoint
    endpoint_enabled: bool = False
    endpoint_host: str = "127.0.0.1"
    endpoint_port: int = DEFAULT_PORT
    endpoint_api_key: str = field(default="", repr=False)
    endpoint_special_tokens: str = "auto"   # special-token text in clients' messages (engine.server's
    #                                         --special-tokens): auto | text | control
    # a remote OpenAI-compatible server instead of the local engine
    remote_enabled: bool = False
    remote_base_url: str = ""
    remote_api_key: str = field(default="", repr=False)
    remote_model: str = ""
    # models
    last_model: str = ""                 # checkpoint directory loaded last
    model_folders: list[str] = field(default_factory=list)
    hf_token: str = field(default="", repr=False)
    # the packaged app
    check_updates: bool = False          # ask the releases feed for a newer version at start (opt-in)

    @classmethod
    def load(cls, store) -> AppSettings:
        saved = store.get_setting(SETTINGS_KEY, {}) or {}
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def save(self, store) -> None:
        store.set_setting(SETTINGS_KEY, asdict(self))

    def copy(self, **changes) -> AppSettings:
        return AppSettings(**{**asdict(self), **changes})

    def changed_fields(self, other: AppSettings) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)}

    def engine_config(self, model_path: str) -> EngineConfig:
        """The engine's config: every setting named as an EngineConfig field, the model's drafter (if one is set for
        it), the disk cache on."""
        engine = {f.name for f in fields(EngineConfig)}
        return EngineConfig(model=model_path, disk_cache=True, drafter=self.drafters.get(model_path),
                            **{f.name: getattr(self, f.name) for f in fields(self) if f.name in engine})

    def sampling_params(self, thinking: bool) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, min_p=self.min_p, presence_penalty=self.presence_penalty,
                              thinking_budget=THINKING_BUDGETS[self.reasoning_effort] if thinking else None)


# the settings that are EngineConfig fields: changing one needs the engine reloaded
RELOAD_FIELDS = (frozenset(f.name for f in fields(AppSettings)) & frozenset(f.name for f in fields(EngineConfig))
                 | {"drafters"})
