"""A request's prompt (engine/core/prompts.py) where the engine has no chat template: an engine around an already
built model (Engine.from_model, the benchmarks' HTTP server) takes token ids and refuses chat messages clearly."""

import pytest

from engine.bench.random_model import bench_tokenizer, text_config
from engine.core.params import EngineConfig
from engine.core.prompts import Prompts
from engine.model.config import parse_model_config


def test_chat_messages_without_a_template_are_refused():
    prompts = Prompts(EngineConfig(model="random"), parse_model_config(text_config("tiny")), bench_tokenizer(),
                      template=None, image_config=None, accepts_images=False)
    assert prompts.encode([3, 1, 4]) == [3, 1, 4]
    with pytest.raises(ValueError, match="no chat template"):
        prompts.encode([{"role": "user", "content": "hello"}])
    with pytest.raises(ValueError, match="no chat template"):
        prompts.render([{"role": "user", "content": "hello"}], None, None, {})
