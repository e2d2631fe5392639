"""Chat formatting: the checkpoint's own chat template."""

from engine.chat.template import ChatTemplate, ChatTemplateError

__all__ = ["ChatTemplate", "ChatTemplateError"]
