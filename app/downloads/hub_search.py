"""Hugging Face search: checkpoints beyond the catalog. The hub's model search, then, for each result, its
config.json and its file sizes, read before anything is downloaded: a result is offered when the engine reads its
architecture (the Qwen3.5 family, dense or MoE) and its weights' format (16-bit, FP8 blocks, GPTQ / AWQ int4).
The plan of what it runs as on this machine is the engine's (the Models page asks engine.api.plan_for), and a
download goes through the same resumable, verified path as the catalog's (`hub.list_repo`, `DownloadManager`)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from huggingface_hub import HfApi

from app.downloads.hub import HubError, RangeReader, auth_headers, file_url, list_repo
from engine.api import CheckpointError, ModelConfig, detect_format, parse_model_config, with_side_quant_config

DEFAULT_QUERY = "Qwen3.5"       # what an empty search box searches for
RESULTS = 30                    # hub results looked at per search (each costs two requests)
MAX_CONFIG_BYTES = 1 << 20      # a config.json larger than this is not one
TIMEOUT_S = 20.0
REPO_ID = re.compile(r"[\w.-]{1,96}/[\w.-]{1,96}")     # the hub's own rule; anything else is not shown or fetched
FORMAT_NAMES = {"bf16": "BF16", "fp16": "FP16", "fp32": "FP32", "fp8_block": "FP8", "gptq": "GPTQ int4",
                "awq": "AWQ int4"}


@dataclass(frozen=True)
class Candidate:
    """A hub repository the engine can run, as read before downloading it."""
    repo_id: str
    architecture: ModelConfig
    source_format: str          # FORMAT_NAMES' words: BF16, FP8, GPTQ int4, ...
    download_bytes: int         # the files a download fetches (hub.WANTED)
    downloads: int
    likes: int


@dataclass(frozen=True)
class SearchResult:
    query: str
    candidates: list[Candidate]
    left_out: dict[str, str]    # repo id -> why it is not offered (another architecture, format, no safetensors)


def search_hub(query: str, token: str | None, endpoint: str | None, limit: int = RESULTS) -> SearchResult:
    """The hub's search for `query` (most downloaded first), each result checked; HubError when the hub cannot
    be asked at all."""
    query = query.strip() or DEFAULT_QUERY
    api = HfApi(endpoint=endpoint, token=token or None)
    try:
        found = list(api.list_models(search=query, sort="downloads", limit=limit))
    except Exception as e:  # noqa: BLE001 (unreachable hub, an error status: the HTTP library's own types)
        raise HubError(f"cannot search the hub ({type(e).__name__})", retryable=True) from None
    found = [info for info in found if REPO_ID.fullmatch(info.id or "")]
    with ThreadPoolExecutor(max_workers=8) as pool:
        checked = list(pool.map(lambda info: _check(info, token, endpoint), found))
    return SearchResult(query, [c for c in checked if isinstance(c, Candidate)],
                        {info.id: c for info, c in zip(found, checked) if isinstance(c, str)})


def _check(info, token: str | None, endpoint: str | None) -> Candidate | str:
    """The candidate, or why it is left out."""
    try:
        listing = list_repo(info.id, "main", token, endpoint)
        raw = read_json(info.id, "config.json", token, endpoint)
        architecture = parse_model_config(raw)
        present = {f.path for f in listing.files}
        raw = with_side_quant_config(raw, lambda name: read_json(info.id, name, token, endpoint)
                                     if name in present else None)
        source = detect_format(raw, ())
    except (HubError, CheckpointError, ValueError) as e:   # UnsupportedModelError and a bad config are ValueErrors
        return str(e)
    return Candidate(info.id, architecture, FORMAT_NAMES[source], listing.total_bytes, info.downloads or 0,
                     info.likes or 0)


def read_json(repo_id: str, name: str, token: str | None, endpoint: str | None) -> dict:
    """A JSON object file of the repository (config.json, a quantization side file: at most MAX_CONFIG_BYTES),
    through the downloader's HTTP reader."""
    reader = RangeReader(file_url(repo_id, name, "main", endpoint), 0, auth_headers(token), TIMEOUT_S)
    try:
        if reader.status != 200:
            raise HubError(f"{repo_id} has no {name} (the hub answered {reader.status})", retryable=False)
        data = b""
        while len(data) <= MAX_CONFIG_BYTES and (piece := reader.read(65536)):
            data += piece
    finally:
        reader.close()
    if len(data) > MAX_CONFIG_BYTES:
        raise HubError(f"{repo_id}'s {name} is larger than {MAX_CONFIG_BYTES >> 20} MiB", retryable=False)
    try:
        raw = json.loads(data)
    except ValueError:
        raise HubError(f"{repo_id}'s {name} is not JSON", retryable=False) from None
    if not isinstance(raw, dict):
        raise HubError(f"{repo_id}'s {name} is not an object", retryable=False)
    return raw
