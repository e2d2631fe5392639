"""Tool servers without the chat: the mcpServers JSON, the MCP client against real servers (stdio and Streamable
HTTP), the calculator's evaluator, the grammar over the real server's schema, Settings → Tools, and the export."""

import json
import socket
import subprocess
import sys
import time

import jsonschema
import pytest

from app.tools.config import ServerConfig, ToolSettings, load_tool_settings, parse_servers, save_tool_settings
from app.tools.examples.calc_clock_server import evaluate
from app.tools.manager import MAX_IMAGES, MAX_OUTPUT_CHARS, ToolServers, result_content
from mcp.server.mcpserver.exceptions import ToolError
from tests.test_app_tools import SERVERS, TEST_SERVER

CLAUDE_DESKTOP = {"mcpServers": {
    "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                   "env": {"DEBUG": "1"}},
    "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
    "old": {"command": "uvx", "args": ["mcp-server-time"], "disabled": True}}}


def test_mcp_servers_json_is_read_as_claude_desktop_lm_studio_and_cursor_write_it(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENDESK_DATA_DIR", str(tmp_path))
    servers = parse_servers(CLAUDE_DESKTOP)
    assert [(s.name, s.transport, s.disabled) for s in servers] == [
        ("filesystem", "stdio", False), ("remote", "http", False), ("old", "stdio", True)]
    assert servers[0].launch() == ("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"])
    assert servers[0].env == {"DEBUG": "1"} and servers[1].headers == {"Authorization": "Bearer x"}
    assert parse_servers(CLAUDE_DESKTOP["mcpServers"]) == servers          # the map alone
    save_tool_settings(ToolSettings(servers + [ServerConfig("files", builtin="files", folder="/data")],
                                    ["remote/search"], 3))
    again = load_tool_settings()
    assert again.servers[:3] == servers and again.server("files").launch()[1][1] == "/data"
    assert again.always_allowed == ["remote/search"] and again.max_rounds == 3
    for bad, why in (({"x": {"args": []}}, "give a command"), ({"x": {"url": "ftp://h"}}, "http"),
                     ({"x": {"type": "sse", "url": "http://h/sse"}}, "SSE"), ({}, "mcpServers"),
                     ({"x": {"command": "a", "env": {"K": 1}}}, "env")):
        with pytest.raises(ValueError, match=why):
            parse_servers(bad)


def test_a_result_is_capped_in_text_and_images():
    from mcp.types import CallToolResult, ImageContent, TextContent

    image = ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    text, images = result_content(CallToolResult(content=[TextContent(type="text", text="x" * (MAX_OUTPUT_CHARS + 5))]
                                                 + [image] * (MAX_IMAGES + 2)))
    assert text.startswith("x" * MAX_OUTPUT_CHARS) and "5 more characters left out" in text
    assert len(images) == MAX_IMAGES and "2 image(s) left out" in text


def test_the_calculator_evaluates_arithmetic_and_nothing_else():
    assert evaluate("(2 + 3) * sqrt(16)") == 20.0 and evaluate("2 ** 10 % 7") == 2 and evaluate("-pi") < -3
    for bad in ("__import__('os')", "open('x')", "(1).__class__", "9 ** 9 ** 9", "x", "[1, 2]", "'a' * 3"):
        with pytest.raises(ToolError):
            evaluate(bad)


@pytest.fixture
def servers(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENDESK_DATA_DIR", str(tmp_path))
    statuses = []
    box = ToolServers(on_status=lambda name, status: statuses.append((name, status.state)), call_timeout_s=1.0)
    box.statuses = statuses
    yield box
    box.close()


def test_a_crashed_server_says_so_and_starts_again_when_next_used(servers, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "note.txt").write_text("hello from the folder")
    (tmp_path / "secret.txt").write_text("not for tools")
    servers.configure(SERVERS + [ServerConfig("files", builtin="files", folder=str(shared))])
    assert servers.call("files", "read_file", {"path": "note.txt"}).result().text == "hello from the folder"
    outside = servers.call("files", "read_file", {"path": "../secret.txt"}).result()
    assert outside.status == "error" and "outside the shared folder" in outside.text
    crashed = servers.call("test-tools", "crash", {}).result()
    assert crashed.status == "error" and "crashing on purpose" in crashed.text
    status = servers.status("test-tools")
    assert status.state == "failed" and "starts again when next used" in status.message
    again = servers.call("test-tools", "set_lamp", {"code": "L-001", "state": "on",
                                                   "where": {"room": "hall", "floor": 1}}).result()
    assert again.status == "ok" and servers.status("test-tools").state == "ready"
    assert ("test-tools", "failed") in servers.statuses and servers.statuses[-1] == ("test-tools", "ready")
    refused = servers.call("test-tools", "no_such_tool", {}).result()
    assert refused.status == "error" and servers.status("test-tools").state == "ready"


def test_the_app_serves_its_built_in_servers_itself_as_the_frozen_app_runs_them(servers, tmp_path):
    """`qwendesk --tool-server NAME [FOLDER]`: what ServerConfig.launch runs in a frozen app (no Python to run a
    script with)."""
    (tmp_path / "a.txt").write_text("A")
    servers.configure([ServerConfig("files", command=sys.executable, args=["-m", "app", "--tool-server", "files",
                                                                         str(tmp_path)]),
                       ServerConfig("calc", command=sys.executable, args=["-m", "app", "--tool-server",
                                                                        "calculator-clock"])])
    assert servers.call("files", "read_file", {"path": "a.txt"}).result().text == "A"
    assert servers.call("calc", "calculate", {"expression": "6 * 7"}).result().text == "6 * 7 = 42"


def test_a_server_that_cannot_start_says_why(servers):
    servers.configure([ServerConfig("broken", command=sys.executable, args=["-c", "import sys; "
                                    "sys.stderr.write('missing API key\\n'); sys.exit(2)"])])
    found = servers.tools(["broken"]).result()
    assert "missing API key" in found["broken"] and servers.status("broken").state == "failed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_streamable_http_server(servers):
    port = free_port()
    process = subprocess.Popen([sys.executable, TEST_SERVER, "--http", str(port)], stderr=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        servers.configure([ServerConfig("web", url=f"http://127.0.0.1:{port}/mcp",
                                        headers={"Authorization": "Bearer test"})])
        listed = servers.tools(["web"]).result()["web"]
        assert [t.name for t in listed] == ["crash", "hang", "picture", "set_lamp"]
        result = servers.call("web", "picture", {}).result()
        assert result.status == "ok" and result.images[0][0] == "image/png"
        assert servers.call("web", "hang", {}).result().status == "timeout"
    finally:
        process.kill()
        process.wait()


def test_calls_to_a_real_servers_schema_with_a_pattern_enums_and_a_nested_object_are_always_valid(servers, checkpoint):
    """The schema as the MCP server publishes it (pydantic: pattern, Literal enums, a $ref'd model), forced with
    tool_choice over many seeds: each call the tiny random model makes validates."""
    from engine.api import Constraint, Engine, EngineConfig, SamplingParams, add_calls

    servers.configure(SERVERS)
    lamp = next(t for t in servers.tools(["test-tools"]).result()["test-tools"] if t.name == "set_lamp")
    tools = [lamp.schema()]
    engine = Engine(EngineConfig(model=str(checkpoint("base")), device="cpu", dtype="float32", max_context=2048,
                                 page_size=16, profile="C8", max_queue=64))
    try:
        prompt = [{"role": "user", "content": "Switch a lamp"}]
        forced = Constraint(tools=tools, tool_mode="required", tool_name="set_lamp")
        handles = [engine.submit(prompt, SamplingParams(max_tokens=400, temperature=1.0, seed=seed, constraint=forced),
                                 tools=tools, enable_thinking=False)
            for seed in range(24)]
        seen = set()
        for handle in handles:
            calls, finish = [], None
            for event in handle:
                add_calls(calls, event.pieces)
                finish = event.finish_reason or finish
            assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
            arguments = json.loads(calls[0].arguments)
            jsonschema.validate(arguments, lamp.parameters)
            seen.add((arguments["state"], arguments["where"]["room"]))
        assert len(seen) > 3            # the seeds do vary the calls
    finally:
        engine.close()
