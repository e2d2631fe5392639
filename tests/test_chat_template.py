"""ChatTemplate renders exactly what transformers' apply_chat_template(tokenize=False) renders."""

import copy
import hashlib
import json
from dataclasses import dataclass

import pytest

from engine.chat import ChatTemplate, ChatTemplateError
from tests.fixtures.tokenizer import TEMPLATES, write_tokenizer

transformers = pytest.importorskip("transformers")

# sha256 of the chat_template field of Qwen/Qwen3.5-27B (= Qwen3.5-9B) and Qwen/Qwen3.6-27B.
OFFICIAL_SHA256 = {
    "qwen3_5": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "qwen3_6": "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Météo actuelle d'une ville — 天气",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
ASK = {"role": "user", "content": "What's the weather in Paris and Tokyo?"}
CALLS = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {
        "city": "Paris", "days": 3, "metric": True, "extra": None, "tags": ["a", "b"], "opts": {"k": 1.5}}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}},
]}
RESULTS = [{"role": "tool", "content": '{"temp": 21}'}, {"role": "tool", "content": '{"temp": 18}'}]

CASES = {
    "system_user": ([SYSTEM, {"role": "user", "content": "Hi!"}], {}),
    "multi_turn": ([SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "Thanks"}], {}),
    "tools_prompt": ([SYSTEM, ASK], {"tools": TOOLS}),
    "tool_round_trip": ([ASK, CALLS, *RESULTS], {"tools": TOOLS}),
    "tool_calls_flat_and_empty_content": ([ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"name": "search", "arguments": {"q": "weather"}}]}, RESULTS[0],
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And tomorrow?"}], {"tools": TOOLS}),
    "thinking_off": ([ASK], {"enable_thinking": False}),
    "thinking_on": ([ASK], {"enable_thinking": True}),
    "reasoning_content": ([ASK, {**CALLS, "reasoning_content": "I should call the tool twice."}, *RESULTS,
                           {"role": "assistant", "content": "21 and 18.", "reasoning_content": "Summarise."}],
                          {"tools": TOOLS}),
    "reasoning_history": ([{"role": "user", "content": "Q1"},
                           {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                           {"role": "user", "content": "Q2"}], {}),
    "reasoning_aliases": ([{"role": "user", "content": "Q1"},
                           {"role": "assistant", "content": "A1", "thinking": "T1"},
                           {"role": "user", "content": "Q2"},
                           {"role": "assistant", "content": "A2", "reasoning": "R2"}], {}),
    "inline_think": ([{"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "<think>\nhidden steps\n</think>\n\nvisible answer"},
                      {"role": "user", "content": "Q2"},
                      {"role": "assistant", "content": "<think>\nnew steps\n</think>\n\nnew answer"}], {}),
    "preserve_thinking": ([{"role": "user", "content": "Q1"},
                           {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                           {"role": "user", "content": "Q2"}], {"preserve_thinking": True}),
    "vision": ([{"role": "user", "content": [
        {"type": "image", "image": "a.png"}, {"type": "text", "text": "Compare with"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "video", "video": "v.mp4"}, {"type": "text", "text": "please."}]},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this?"}]}],
        {"add_vision_id": True}),
    "vision_no_ids": ([{"role": "user", "content": [{"type": "image"}, {"type": "video"},
                                                    {"type": "text", "text": "?"}]}], {}),
    "unicode": ([{"role": "system", "content": "Réponds en français 🇫🇷"},
                 {"role": "user", "content": "你好！ مرحبا 👩‍💻 café e\u0301 \u0000 tab\tend"}], {}),
    "template_kwargs_pass_through": ([ASK], {"reasoning_effort": "high", "custom_flag": [1, 2]}),
}


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_6"])
def pair(request, tmp_path_factory):
    """(ours, transformers' tokenizer) for one checkpoint template."""
    directory = tmp_path_factory.mktemp(request.param)
    write_tokenizer(directory, kind="tiny", template=request.param)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    return ChatTemplate.from_checkpoint(directory), theirs


def render_both(pair, messages, **kwargs):
    ours, theirs = pair
    expected = theirs.apply_chat_template(copy.deepcopy(messages), tokenize=False, **copy.deepcopy(kwargs))
    return ours.render(copy.deepcopy(messages), **kwargs), expected


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers(pair, case, generation_prompt):
    messages, kwargs = CASES[case]
    ours, expected = render_both(pair, messages, add_generation_prompt=generation_prompt, **kwargs)
    assert ours == expected


def test_fixture_templates_are_the_official_text():
    for name, digest in OFFICIAL_SHA256.items():
        assert hashlib.sha256((TEMPLATES / f"{name}.jinja").read_bytes()).hexdigest() == digest


def test_versions_differ_where_documented(tmp_path):
    templates = {}
    for name in OFFICIAL_SHA256:
        write_tokenizer(tmp_path / name, template=name)
        templates[name] = ChatTemplate.from_checkpoint(tmp_path / name)
    messages, kwargs = CASES["preserve_thinking"]
    assert "R1" not in templates["qwen3_5"].render(messages, **kwargs)
    assert "<think>\nR1\n</think>" in templates["qwen3_6"].render(messages, **kwargs)
    messages, kwargs = CASES["tool_round_trip"]
    assert "<parameter=metric>\nTrue\n" in templates["qwen3_5"].render(messages, **kwargs)
    assert "<parameter=metric>\ntrue\n" in templates["qwen3_6"].render(messages, **kwargs)


def test_generation_prompt_default_and_thinking_switch(pair):
    ours, _ = pair
    assert ours.render([ASK]).endswith("<|im_start|>assistant\n<think>\n")
    assert ours.render([ASK], enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "hi"}, SYSTEM], "System message must be at the beginning."),
    ([{"role": "assistant", "content": "hi"}], "No user query found in messages."),
    ([{"role": "system", "content": [{"type": "image"}]}, ASK], "System message cannot contain images."),
    ([{"role": "robot", "content": "hi"}, ASK], "Unexpected message role."),
])
def test_template_errors(pair, messages, message):
    ours, theirs = pair
    with pytest.raises(ChatTemplateError, match=message) as raised:
        ours.render(messages)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(Exception, match=message):
        theirs.apply_chat_template(messages, tokenize=False)


def test_empty_conversation_and_bad_inputs(pair):
    ours, _ = pair
    with pytest.raises(ChatTemplateError, match="empty"):
        ours.render([])
    with pytest.raises(ChatTemplateError, match="dict"):
        ours.render(["hello"])
    with pytest.raises(ChatTemplateError, match="JSON-schema"):
        ours.render([ASK], tools=[len])


def test_message_objects_become_plain_data(pair):
    @dataclass
    class Message:
        role: str
        content: str

    ours, _ = pair
    assert ours.render([Message("user", "hi")]) == ours.render([{"role": "user", "content": "hi"}])


HELPERS = (
    "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ image_token }}|{{ documents }}|"
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{{ ns.n }}|"
    "{{ tools | tojson(indent=2) }}|{{ dict(a='é', b=[1, 2]) | tojson }}|{{ strftime_now('%Y') }}|"
    "{{ add_generation_prompt }}"
)


def test_helpers_and_special_token_variables_match(tmp_path):
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = HELPERS
    config["bos_token"] = "<|endoftext|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    ours = ChatTemplate.from_checkpoint(tmp_path).render(messages, tools=TOOLS)
    assert ours == theirs.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours.startswith("<|endoftext|>|<|im_end|>|<|endoftext|>|<|image_pad|>|None|ab2|")


def test_named_templates_and_file_priority(tmp_path):
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "plain:{{ messages[0].content }}"},
                               {"name": "tool_use", "template": "tools:{{ tools | length }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
    template = ChatTemplate.from_checkpoint(tmp_path)
    assert template.names == ("default", "tool_use")
    for tools in (None, TOOLS):
        assert template.render([ASK], tools=tools) == theirs.apply_chat_template(
            [ASK], tools=tools, tokenize=False, add_generation_prompt=True)
    assert template.render([ASK], tools=TOOLS, template_name="default").startswith("plain:")
    with pytest.raises(ChatTemplateError, match="no chat template named 'rag'"):
        template.render([ASK], template_name="rag")

    (tmp_path / "chat_template.jinja").write_text("file:{{ messages | length }}")
    assert ChatTemplate.from_checkpoint(tmp_path).render([ASK]) == "file:1"


def test_missing_or_broken_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_checkpoint(tmp_path)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% if %}")
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([ASK])


CUT_SHORT = [ASK, {"role": "assistant", "content": "Paris is sunny and Tokyo", "reasoning_content": "Two cities."}]


def test_continue_final_message_matches_transformers(pair):
    ours, expected = render_both(pair, CUT_SHORT, continue_final_message=True)
    assert ours == expected and ours.endswith("<think>\nTwo cities.\n</think>\n\nParis is sunny and Tokyo")


def test_continue_a_reply_cut_short_while_thinking(pair):
    ours, _ = pair
    thinking = [ASK, {"role": "assistant", "content": "", "reasoning_content": "First Paris, then"}]
    rendered = ours.render(thinking, continue_final_message=True)
    assert rendered.endswith("<|im_start|>assistant\n<think>\nFirst Paris, then")
    with pytest.raises(ChatTemplateError, match="continue_final_message"):
        ours.render([ASK, {"role": "assistant", "content": ""}], continue_final_message=True)
