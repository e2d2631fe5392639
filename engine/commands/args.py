"""What the command lines (qwendesk-chat, qwendesk-serve, qwendesk-bench) check while parsing: a bad value
is refused with argparse's one-line error and exit 2 before anything loads. The rules are the engine's own
(EngineConfig.validate, SamplingParams.validate, a checkpoint's config.json); this module applies them early.
Nothing here imports torch, so a refusal is quick."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

from engine.model.config import load_model_config

log = logging.getLogger(__name__)
REPO_ID = re.compile(r"^\w[\w.-]*/\w[\w.-]*$")     # "Qwen/Qwen3.5-9B"; "./x" or "../x" is a path


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal is the error line and where the options are: argparse's usage of a command
    with many options ran to a dozen lines above the one that mattered."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nRun {self.prog} --help for the options.\n")


def model_arg(value: str) -> str:
    """argparse type of --model: a checkpoint directory (it must exist and hold a config.json the engine
    supports) or, when no such path exists, a Hugging Face repo id (resolve_model downloads it)."""
    path = Path(value).expanduser()
    if not path.exists():
        if REPO_ID.match(value):
            return value
        raise argparse.ArgumentTypeError(f"{value} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file; a checkpoint is a directory")
    try:
        load_model_config(path)
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return str(path)


def resolve_model(model: str) -> str:
    """A checkpoint directory as is; a repo id ("Qwen/Qwen3.5-9B") downloaded into the Hugging Face cache."""
    if Path(model).exists():
        return model
    from huggingface_hub import snapshot_download

    log.info("downloading %s", model)
    try:
        return snapshot_download(model)
    except Exception as e:  # network, authentication, unknown repo: the hub's own words, on one line
        raise OSError(f"{model} is not a directory here, and downloading it from the Hugging Face hub failed: "
                      f"{' '.join(str(e).split())}") from None


def model_name(model: str) -> str:
    """The name a model goes by: a repo id as is, a directory by its folder name."""
    return model if REPO_ID.match(model) and not Path(model).exists() else Path(model).resolve().name


def port_arg(value: str) -> int:
    """argparse type of --port."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, not {port}")
    return port


def positive_int(value: str) -> int:
    """argparse type of a count that must be at least 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def checked(parser: argparse.ArgumentParser, settings):
    """`settings` (an EngineConfig or SamplingParams) after its own validate(); a refusal is a usage
    error: the parser's one-line message and exit 2."""
    try:
        settings.validate()
    except ValueError as e:
        parser.error(str(e))
    return settings


def drafter_arg(value: str) -> str:
    """argparse type of --drafter: a DFlash / DFlash2 drafter checkpoint directory with a config.json the engine reads
    (whether it fits the model is checked with the model: EngineConfig, the plan)."""
    from engine.model.drafter_config import read_drafter_config
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is not a directory (a drafter checkpoint is a folder)")
    try:
        read_drafter_config(path)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return str(path)


def add_speculation_args(ap: argparse.ArgumentParser) -> None:
    """--speculation, --drafter and --speculative-tokens (EngineConfig's fields of the same names)."""
    from engine.core.params import SPECULATION
    ap.add_argument("--speculation", default="auto", choices=SPECULATION,
                    help="how to draft: the block drafter when --drafter is given, else the model's MTP head (auto)")
    ap.add_argument("--drafter", type=drafter_arg, default=None, metavar="DIR",
                    help="a DFlash / DFlash2 drafter checkpoint made for this model")
    ap.add_argument("--speculative-tokens", type=int, default=None, metavar="K",
                    help="most drafts per decode round (0: off; up to 5 with MTP, 15 with a drafter; default on a GPU: "
                         "3 with MTP, the drafter's block - 1; 0 on the CPU)")


def speculation_settings(args: argparse.Namespace) -> dict:
    return dict(speculation=args.speculation, drafter=args.drafter, speculative_tokens=args.speculative_tokens)
