"""qwendesk-serve around random weights at a model's real shapes: the soak's server at 27B shapes with no 27B
checkpoint written to disk.

    python -m tests.random_serve --weights int4 --model DIR [qwendesk-serve's options]

DIR holds what a checkpoint holds besides its weights: the config.json of a shape
(engine.bench.random_model.text_config) and the tokenizer files with the chat template (`write_model_dir`: the real
Qwen3.5 vocabulary and template of tests/fixtures/tokenizer.py). The weights are engine.bench.random_model's, seeded,
built on the device in place (int4: random codes and scales; bf16: the activation dtype), with the MTP module when the
engine speculates. The rest is qwendesk-serve's own path: its arguments and their checks, its HTTP app and shutdown,
an engine with its memory plan, warm-up, cache tiers and metrics (Engine.from_model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.server.cli import serve_main


def write_model_dir(path: Path, shape: str) -> Path:
    """The folder tests.random_serve serves: `shape`'s config.json, and the real vocabulary (248,077 ids, as the
    published checkpoints: the model's 248,320 rows include unused ones) with Qwen3.5's chat template."""
    from engine.bench.random_model import text_config
    from tests.fixtures.tokenizer import write_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(text_config(shape), indent=1))
    write_tokenizer(path, kind="qwen")
    return path


def random_engine(config, weights: str):
    """An engine around random weights at the shapes of config.model's config.json."""
    from engine.api import Engine
    from engine.chat.template import ChatTemplate
    from engine.core.device import resolve_device, resolve_dtype
    from engine.bench.random_model import build_random_model
    from engine.text.tokenizer import Tokenizer

    device = resolve_device(config.device)
    raw = json.loads((Path(config.model) / "config.json").read_text())
    model = build_random_model(raw, weights, check=False, mtp=config.drafts(device.type == "cuda") > 0,
                               device=device, dtype=resolve_dtype(config.dtype, device.type))
    return Engine.from_model(config, model, Tokenizer.from_checkpoint(config.model),
                             ChatTemplate.from_checkpoint(config.model))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.random_serve", allow_abbrev=False,
                                 description=__doc__.split("\n\n")[0], epilog="Other options: qwendesk-serve's.")
    ap.add_argument("--weights", default="int4", choices=["int4", "bf16"])
    ours, rest = ap.parse_known_args(argv)
    serve_main(rest, load=lambda config: random_engine(config, ours.weights))


if __name__ == "__main__":
    main(sys.argv[1:])
