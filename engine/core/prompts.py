"""A request's prompt as the model reads it: token ids checked against the vocabulary, or chat messages rendered with
the checkpoint's template; images checked, preprocessed and given their rows of placeholder tokens. Any thread."""

from __future__ import annotations

from engine.chat.template import ChatTemplate
from engine.core.params import EngineConfig
from engine.model.config import ModelConfig
from engine.text.tokenizer import Tokenizer
from engine.vision.processor import ImageInputError, ImageProcessorConfig, ProcessedImage, process_image
from engine.vision.prompt import ImagePrompt, image_prompt, split_images
from engine.vision.tokens import expand_image_placeholders

NO_VISION = "the loaded model has no vision"


class Prompts:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, tokenizer: Tokenizer,
                 template: ChatTemplate | None, image_config: ImageProcessorConfig | None, accepts_images: bool):
        self.config, self.model_config, self.tokenizer, self.template = config, model_config, tokenizer, template
        self.image_config, self.accepts_images = image_config, accepts_images

    def encode(self, prompt, tools=None, continue_final_message: bool = False, **template_kwargs) -> list[int]:
        """Token ids as given, or chat messages rendered with the checkpoint's template (Engine.encode_prompt)."""
        if isinstance(prompt, str):
            raise TypeError("give token ids or chat messages (a list of {'role', 'content'} dicts), not a str")
        if prompt and isinstance(prompt[0], dict):
            if self.template is None:       # an engine built around a model without its checkpoint (from_model)
                raise ValueError("this engine has no chat template: give token ids, not chat messages")
            text = self.template.render(prompt, tools=tools, add_generation_prompt=not continue_final_message,
                                        continue_final_message=continue_final_message, **template_kwargs)
            return self.tokenizer.encode(text)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        return ids

    def process_images(self, images: list[bytes]) -> list[ProcessedImage]:
        """Encoded image files -> the tower's inputs, within the engine's limits (Engine.process_images)."""
        if not images:
            return []
        if not self.accepts_images:
            raise ImageInputError(NO_VISION)
        limit = self.config.max_images
        if len(images) > limit:
            raise ImageInputError(f"the request has {len(images)} images; at most {limit} are allowed")
        big = next((i for i, data in enumerate(images) if len(data) > self.config.max_image_bytes), None)
        if big is not None:
            raise ImageInputError(f"image {big + 1} is {len(images[big]) / 2**20:.1f} MiB; at most "
                                  f"{self.config.max_image_bytes / 2**20:.1f} MiB per image are allowed")
        assert self.image_config is not None, "an engine that accepts images has its processor's config"
        processed = []
        for i, data in enumerate(images):
            try:
                processed.append(process_image(data, self.image_config))
            except ImageInputError as e:
                raise ImageInputError(f"image {i + 1}: {e}" if len(images) > 1 else str(e)) from None
        return processed

    def expand_images(self, ids: list[int], images: list[ProcessedImage]) -> list[int]:
        """Each image placeholder repeated to its image's token count (Engine.expand_images)."""
        if not images:
            return ids
        assert self.model_config.image_token_id is not None, "images are processed only where the model has vision"
        return expand_image_placeholders(ids, self.model_config.image_token_id, images)

    def render(self, prompt, tools, images, template_kwargs) -> tuple[list[int], ImagePrompt | None]:
        """A request's token ids and its ImagePrompt (None without images): submit's and warm's."""
        if prompt and not isinstance(prompt, str) and isinstance(prompt[0], dict):
            if images:
                raise ValueError("images go inside chat messages as image parts, or with token ids")
            prompt, data = split_images(prompt)
            images = self.process_images(data)
            ids = self.expand_images(self.encode(prompt, tools=tools, **template_kwargs), images)
        else:
            ids = self.encode(prompt, tools=tools, **template_kwargs)
        if images and not self.accepts_images:
            raise ImageInputError(NO_VISION)
        if not images:
            return ids, None
        mc = self.model_config
        assert mc.image_token_id is not None and mc.vision is not None, "images pass only where the model has vision"
        return ids, image_prompt(ids, list(images), mc.image_token_id, mc.vision.spatial_merge_size)
