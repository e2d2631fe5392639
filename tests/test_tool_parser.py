"""The Qwen tool-call parser: both call forms, schema typing, malformed output, any chunking."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.chat.tool_values import call_arguments, coerce
from engine.chat.tools import CallArgs, CallStart, Text, ToolCallParser, tool_schemas

TOOLS = tool_schemas([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "temp": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
            "note": {"type": ["string", "null"]}, "mode": {"enum": ["fast", "slow"]},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
])


def xml_call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def run(text, chunks=None, schemas=TOOLS):
    """Feed `text` (split at `chunks` sizes, or whole) -> (shown text, [(name, args dict)], events)."""
    p = ToolCallParser(schemas)
    events, i = [], 0
    for n in chunks or [len(text)]:
        events += p.feed(text[i:i + n])
        i += n
    events += p.feed(text[i:]) + p.finish()
    shown = "".join(e.text for e in events if isinstance(e, Text))
    calls = {}
    for e in events:
        if isinstance(e, CallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, CallArgs):
            calls[e.index][1] += e.text
    return shown, [(name, json.loads(args)) for name, args in calls.values()], events


def test_plain_text_passes_through():
    assert run("Hello, world!\nNo tools here.")[:2] == ("Hello, world!\nNo tools here.", [])


def test_xml_call_typed_by_schema():
    text = "Let me check.\n\n" + xml_call("get_weather", city="Paris", days="3", metric="true", temp="21.5",
                                           opts='{"a": [1, 2]}', tags='["x", "y"]', note="null", mode="fast",
                                           limit="7")
    shown, calls, _ = run(text)
    assert shown == "Let me check."
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "metric": True, "temp": 21.5, "opts": {"a": [1, 2]},
                                      "tags": ["x", "y"], "note": "null", "mode": "fast", "limit": 7})]


def test_python_style_values_from_the_qwen3_5_template():
    _, calls, _ = run(xml_call("get_weather", metric="False", limit="None", opts="{'a': True}", days="4.0"))
    assert calls[0][1] == {"metric": False, "limit": None, "opts": {"a": True}, "days": 4}


def test_values_that_do_not_fit_their_type_stay_text():
    _, calls, _ = run(xml_call("get_weather", days="three", metric="maybe", temp="NaN", opts="{broken"))
    assert calls[0][1] == {"days": "three", "metric": "maybe", "temp": "NaN", "opts": "{broken"}


def test_multiline_string_value_keeps_its_inner_lines():
    value = "line one\n\n  indented <b>bold</b>\nquote \" backslash \\ tab\t end"
    _, calls, _ = run(xml_call("get_weather", city=value))
    assert calls[0][1]["city"] == value


def test_json_form_and_several_calls():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "noop", "arguments": "{}"}\n</tool_call>')
    shown, calls, events = run(text)
    assert shown == "" and calls == [("get_weather", {"city": "Rome", "days": 2}), ("noop", {})]
    assert [e.index for e in events if isinstance(e, CallStart)] == [0, 1]


def test_no_parameters_gives_an_empty_object():
    assert run(xml_call("noop"))[1] == [("noop", {})]


def test_text_after_a_call_is_shown_without_its_leading_blank():
    shown, calls, _ = run(xml_call("noop") + "\n\nDone.")
    assert shown == "Done." and calls == [("noop", {})]


def test_name_streams_before_the_arguments_finish():
    p = ToolCallParser(TOOLS)
    events = p.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
    assert isinstance(events[0], CallStart) and events[0].name == "get_weather"
    assert "".join(e.text for e in events if isinstance(e, CallArgs)) == '{"city": "Par'
    more = p.feed("is\n</parameter>\n<parameter=days>\n1")
    assert "".join(e.text for e in more) == 'is", "days": '          # an integer waits until it is whole
    rest = p.feed("2\n</parameter>\n</function>\n</tool_call>") + p.finish()
    assert "".join(e.text for e in rest) == "12}"


@pytest.mark.parametrize("text", [
    "<tool_call>\nnot a call at all\n</tool_call>",
    "<tool_call>{broken json</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',                     # no name
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"x": NaN}}</tool_call>',
    "<tool_call>\n<function=>\n</function>\n</tool_call>",
    "<tool_call>\n<function=has space>\n</function></tool_call>",
    "<tool_call>",
    "<tool_call>\n<functio",
    "a < b and <tool_cal is not a tag",
])
def test_malformed_output_degrades_to_text(text):
    shown, calls, _ = run(text)
    assert calls == []
    assert shown == text.strip()


def test_unknown_tool_is_text():
    text = xml_call("rm_rf", path="/")
    shown, calls, _ = run(text)
    assert calls == [] and shown == text


def test_truncated_call_is_closed_into_valid_json():
    _, calls, _ = run("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
    assert calls == [("get_weather", {"city": "Par"})]
    _, calls, _ = run("<tool_call>\n<function=get_weather>\n<parameter=days>\n1")
    assert calls == [("get_weather", {"days": 1})]


def test_forgotten_closing_tags():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n5\n</function>\n"
            "<function=noop>\n</function>\n</tool_call>")
    assert run(text)[1] == [("get_weather", {"city": "Oslo", "days": 5}), ("noop", {})]


def test_stray_text_inside_a_function_is_ignored():
    text = ("<tool_call>\n<function=get_weather>\nhmm\n<parameter=city>\nLima\n</parameter>\nok\n</function>\n"
            "</tool_call>")
    assert run(text)[1] == [("get_weather", {"city": "Lima"})]


def test_any_schema_when_tools_are_unknown():
    calls = run(xml_call("anything", x="1"), schemas=None)[1]
    assert calls == [("anything", {"x": "1"})]


def test_coerce():
    assert coerce(" 42 ", {"integer"}) == 42
    assert coerce("42", {"number"}) == 42
    assert coerce("4.5", {"integer"}) == "4.5"
    assert coerce("1e999", {"number"}) == "1e999"
    assert coerce("null", {"null", "integer"}) is None
    assert coerce("[1, 2", {"array"}) == "[1, 2"


CASES = [
    "Sure.\n\n" + xml_call("get_weather", city="São Paulo 你好 🙂", days="2", opts='{"k": "v"}') + "\nDone.",
    '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>' + xml_call("get_weather", metric="True"),
    "x <tool_call>\nbad</tool_call> y " + xml_call("noop"),
    xml_call("get_weather", city="a\n</param b") + xml_call("unknown_tool", a="1"),
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nunterminated",
]


@settings(max_examples=300, deadline=None, database=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(1, 12), max_size=40))
def test_any_chunking_gives_the_same_result(case, cuts):
    whole = run(case)[:2]
    assert run(case, cuts)[:2] == whole


@settings(max_examples=300, deadline=None, database=None)
@given(pieces=st.lists(st.sampled_from(list("<>/=\n {}\"ab_:") + [
    "<tool_call>", "</tool_call>", "<function=noop>", "<function=get_weather>", "</function>", "<parameter=city>",
    "<parameter=days>", "</parameter>", '{"name": "noop", "arguments": {}}'])),
       cuts=st.lists(st.integers(1, 8), max_size=20))
def test_random_markup_never_raises_and_arguments_are_json(pieces, cuts):
    text = "".join(pieces)
    shown, calls, _ = run(text, cuts)            # json.loads inside run: every call's arguments parse
    assert all(isinstance(args, dict) for _, args in calls)
    assert (shown, calls) == run(text)[:2]


def test_truncated_json_call_is_closed_and_in_call_says_a_call_is_open():
    p = ToolCallParser(None)
    assert p.feed('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa') == [Text("Sure.")]
    assert p.in_call
    events = p.finish()
    assert events[0] == CallStart(0, "get_weather") and json.loads(events[1].text) == {"city": "Pa"}
    assert not p.in_call
    assert run('<tool_call>{"name": "get_weather", "arguments": {"days": 2, "ci')[1] == [("get_weather", {"days": 2})]
    assert run('<tool_call>{"name": "nope", "arguments": {"a": 1')[1] == []       # not one of the tools


def test_call_arguments_from_text_or_dict():
    assert call_arguments('{"city": "Paris"}') == call_arguments({"city": "Paris"}) == {"city": "Paris"}
    assert call_arguments("") == call_arguments(None) == {}
    with pytest.raises(ValueError, match="not valid JSON"):
        call_arguments("{bad")
    with pytest.raises(ValueError, match="must be a JSON object"):
        call_arguments("[1]")
