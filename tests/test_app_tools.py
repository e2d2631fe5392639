"""Tools in the chat: the real engine of a tiny checkpoint, the real tool servers (the built-in ones and
tests/fixtures/mcp_test_server.py) as child processes, approval, results in the transcript, and no process left."""

import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

from app.chat.session import DENIED
from app.tools.config import ServerConfig, ToolSettings, load_tool_settings, save_tool_settings
from tests.app_support import make_context, open_window, page_screenshot, screenshot, seeded_replies, send, wait_ready

TEST_SERVER = str(Path(__file__).resolve().parent / "fixtures" / "mcp_test_server.py")
SERVERS = [ServerConfig("test-tools", command=sys.executable, args=[TEST_SERVER]),
           ServerConfig("calculator-clock", builtin="calculator-clock")]


def children(pid: int | None = None) -> dict[int, str]:
    """This process's child processes (or `pid`'s): pid -> command line."""
    pid = pid or os.getpid()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and stat.rsplit(")", 1)[1].split()[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def open_tools_window(app_env, qtbot, path):
    """The app on a tiny checkpoint (thinking off, short replies) with the test server and the calculator
    configured, at most two tool rounds a turn, a 1.5 s time-out per call; each request to the engine is kept."""
    save_tool_settings(ToolSettings(list(SERVERS), max_rounds=2))
    context = make_context(app_env, last_model=str(path), max_tokens=100, thinking=False,
                           model_folders=[str(Path(path).parent)])
    window = open_window(qtbot, context)
    wait_ready(qtbot, window)
    window.toolbox.servers.call_timeout_s = 1.5
    window.requests = []
    generate = window.engine.generate
    window.engine.generate = lambda rid, messages, params, kwargs: (window.requests.append((messages, params, kwargs)),
                                                                   generate(rid, messages, params, kwargs))
    return window


@pytest.fixture
def tools_window(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch)
    return open_tools_window(app_env, qtbot, checkpoint("base"))


def turn_on(qtbot, window, server: str, tool_choice: str) -> None:
    """The server on in this chat and the model made to call `tool_choice`, through the header's tool menu."""
    chat = window.chat
    chat._fill_tools_menu()
    next(a for a in chat.tools_menu.actions() if a.text().startswith(server)).trigger()
    assert chat.tools_button.isChecked() and window.session.tool_servers() == [server]
    found = {}
    window.toolbox.list_tools([server], found.update)            # started, so the menu lists its tools
    qtbot.waitUntil(lambda: bool(found), timeout=30_000)
    chat._fill_tools_menu()
    choices = next(a for a in chat.tools_menu.actions() if a.menu()).menu()
    next(a for a in choices.actions() if a.text() == f"must call {tool_choice}").trigger()
    assert window.session.options()["tool_choice"] == tool_choice


def answer(qtbot, window, choice: str, timeout: int = 60_000):
    """Wait for the next approval card and answer it; returns what it asked."""
    qtbot.waitUntil(lambda: window.chat.transcript.approval is not None, timeout=timeout)
    card = window.chat.transcript.approval
    asked = card.title.text(), card.arguments.text()
    {"once": card.allow, "always": card.always, "deny": card.deny}[choice].click()
    return asked


def finish_turn(qtbot, window, timeout: int = 60_000) -> None:
    """Wait until the turn ends, denying any further call the model makes."""
    def done():
        if window.chat.transcript.approval is not None:
            window.chat.transcript.approval.deny.click()
        return not window.session.busy
    qtbot.waitUntil(done, timeout=timeout)
    qtbot.wait(50)


def messages(window):
    return window.context.store.messages(window.session.current.id)


def tool_messages(window):
    return [m for m in messages(window) if m.role == "tool"]


def test_a_forced_call_runs_after_approval_and_the_model_reads_its_result(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "test-tools", "set_lamp")
    send(qtbot, window, "Switch the hall lamp on")
    title, arguments = answer(qtbot, window, "once")
    assert title == "Run set_lamp on the tool server test-tools?"
    call = json.loads(arguments)
    schema = window.toolbox.status("test-tools").tools[-1].parameters
    jsonschema.validate(call, schema)                 # the grammar kept the call valid
    qtbot.waitUntil(lambda: bool(tool_messages(window)), timeout=30_000)
    result = tool_messages(window)[0]
    assert result.metrics["status"] == "ok" and result.metrics["server"] == "test-tools"
    assert result.content == f"lamp {call['code']} in the {call['where']['room']} on floor {call['where']['floor']} " \
                             f"is {call['state']}"
    finish_turn(qtbot, window)
    roles = [m.role for m in messages(window)]
    assert roles[:4] == ["user", "assistant", "tool", "assistant"]
    first_request, second_request = window.requests[0], window.requests[1]
    assert first_request[1].constraint.tool_name == "set_lamp" and second_request[1].constraint.tool_name is None
    assert {"role": "tool", "content": result.content} in second_request[0]
    assert [t["function"]["name"] for t in second_request[2]["tools"]] == ["crash", "hang", "picture", "set_lamp"]
    views = window.chat.transcript.views
    shown = [v for v in views if type(v).__name__ == "ToolResultView"][0]
    assert shown.is_open and shown.result.text() == result.content and "set_lamp  ·  test-tools" in shown.toggle.text()
    screenshot(window, "tools_transcript")


def test_the_approval_card_shows_the_call_before_it_runs(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "calculator-clock", "clock")
    send(qtbot, window, "What time is it?")
    qtbot.waitUntil(lambda: window.chat.transcript.approval is not None, timeout=60_000)
    assert not tool_messages(window)                  # nothing ran yet
    screenshot(window, "tools_approval")
    window.chat.composer.stop_requested.emit()        # Stop while asked: the turn ends, nothing runs
    assert window.chat.transcript.approval is None and not window.session.busy and not tool_messages(window)
    send(qtbot, window, "What time is it now?")
    answer(qtbot, window, "always")
    qtbot.waitUntil(lambda: bool(tool_messages(window)), timeout=30_000)
    assert tool_messages(window)[0].metrics["status"] == "ok"
    assert window.toolbox.always_allowed("calculator-clock", "clock")
    assert "calculator-clock/clock" in load_tool_settings().always_allowed      # saved
    finish_turn(qtbot, window)


def test_a_denied_call_is_not_run_and_the_model_is_told(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "calculator-clock", "clock")
    send(qtbot, window, "What time is it?")
    answer(qtbot, window, "deny")
    finish_turn(qtbot, window)
    denied = tool_messages(window)[0]
    assert denied.metrics["status"] == "denied" and denied.content == DENIED
    assert {"role": "tool", "content": DENIED} in window.requests[1][0]
    assert window.toolbox.status("calculator-clock").state == "ready"      # listed, never called
    # editing the message: what followed its first reply goes, and the new text gets a turn of its own
    first_reply = messages(window)[1]
    window.chat._edit_last()
    send(qtbot, window, "What time is it in UTC?")
    answer(qtbot, window, "deny")
    finish_turn(qtbot, window)
    after = messages(window)
    assert [m.role for m in after] == ["user", "assistant", "tool", "assistant"]
    assert after[0].content == "What time is it in UTC?" and after[1].id == first_reply.id
    assert window.context.store.message(first_reply.id).version_count == 2
    assert len(tool_messages(window)) == 1 and tool_messages(window)[0].id != denied.id


def test_a_server_that_crashes_mid_call_is_an_error_result_and_a_failed_status(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "test-tools", "crash")
    send(qtbot, window, "Crash")
    answer(qtbot, window, "once")
    finish_turn(qtbot, window)
    crashed = tool_messages(window)[0]
    assert crashed.metrics["status"] == "error"
    assert "stopped during the call" in crashed.content and "crashing on purpose" in crashed.content
    status = window.toolbox.status("test-tools")
    assert status.state in ("failed", "starting", "ready")      # a second round may start it again
    assert not [p for p, cmd in children().items() if TEST_SERVER in cmd and status.state == "failed"]


def test_a_server_that_never_answers_times_out(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "test-tools", "hang")
    send(qtbot, window, "Hang")
    answer(qtbot, window, "once")
    qtbot.waitUntil(lambda: bool(tool_messages(window)), timeout=30_000)
    hung = tool_messages(window)[0]
    assert hung.metrics["status"] == "timeout" and hung.content == "The tool did not answer within 1.5 s."
    assert 1.4 < hung.metrics["seconds"] < 5
    finish_turn(qtbot, window)


def test_a_tool_returning_an_image_shows_it_and_the_model_is_told(tools_window, qtbot):
    window = tools_window
    turn_on(qtbot, window, "test-tools", "picture")
    send(qtbot, window, "Draw")
    answer(qtbot, window, "once")
    finish_turn(qtbot, window)
    image = tool_messages(window)[0]
    assert image.metrics["status"] == "ok" and len(image.attachments) == 1
    assert Path(image.attachments[0]).read_bytes().startswith(b"\x89PNG")
    view = [v for v in window.chat.transcript.views if type(v).__name__ == "ToolResultView"][0]
    from app.chat.image_viewer import Thumbnail
    assert view.findChildren(Thumbnail) and not view.findChildren(Thumbnail)[0].problem
    # this checkpoint has no vision: the model reads that an image came back
    assert {"role": "tool", "content": "\n[1 image(s) the model cannot see]"} in window.requests[1][0]


def test_a_model_with_vision_gets_the_tools_image(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch, max_tokens=40)
    window = open_tools_window(app_env, qtbot, checkpoint("gqa3_ratio3"))
    assert window.session.vision
    turn_on(qtbot, window, "test-tools", "picture")
    send(qtbot, window, "Draw")
    answer(qtbot, window, "once")
    finish_turn(qtbot, window)
    image = tool_messages(window)[0]
    sent = [m for m in window.requests[1][0] if m["role"] == "tool"]
    assert sent == [{"role": "tool", "content": "", "images": image.attachments}]
    final = messages(window)[-1]
    assert final.role == "assistant" and final.status == "complete" and not final.error
    assert final.metrics["prompt_tokens"] > window.context.store.messages(window.session.current.id)[1].metrics[
        "prompt_tokens"] + 4            # the image's tokens are in the prompt


def test_no_tool_server_process_outlives_the_window(tools_window, qtbot):
    window = tools_window
    found = {}
    window.toolbox.list_tools(["test-tools", "calculator-clock"], found.update)
    qtbot.waitUntil(lambda: len(found) == 2, timeout=30_000)
    servers = {pid: cmd for pid, cmd in children().items() if "server.py" in cmd}
    assert len(servers) == 2, servers
    window.close()
    assert not [pid for pid in servers if Path(f"/proc/{pid}").exists()]


def test_after_a_turn_with_tools_regenerate_export_and_import_keep_the_calls_and_results(tools_window, qtbot,
                                                                                       tmp_path, monkeypatch):
    from app import dialogs
    from app.chat import export

    window = tools_window
    turn_on(qtbot, window, "calculator-clock", "clock")
    send(qtbot, window, "What time is it?")
    answer(qtbot, window, "deny")
    finish_turn(qtbot, window)
    final = messages(window)[-1]
    assert final.role == "assistant" and not final.tool_calls
    # regenerate: a new version of the final answer, read after the same call and result, not a forced call again
    requests = len(window.requests)
    window.session.regenerate(False)
    finish_turn(qtbot, window)
    assert window.context.store.message(final.id).version_count == 2
    assert [m.role for m in messages(window)] == ["user", "assistant", "tool", "assistant"]
    messages_sent, params, _ = window.requests[requests]
    assert messages_sent[-1] == {"role": "tool", "content": DENIED} and params.constraint.tool_name is None
    # export: the call and its result in Markdown, everything in JSON, which imports back
    conversation = window.session.current
    markdown = export.to_markdown(conversation, messages(window))
    assert "**Tool call** `clock`" in markdown and "**Tool result** `clock` on calculator-clock (denied)" in markdown
    saved = tmp_path / "chat.json"
    monkeypatch.setattr(dialogs, "save_path", lambda *a: str(saved))
    window.chat.export_conversation(conversation.id, "json")
    monkeypatch.setattr(dialogs, "open_path", lambda *a: str(saved))
    window.chat.import_conversation()
    imported = messages(window)
    assert window.session.current.id != conversation.id
    assert [(m.role, m.content, m.metrics.get("status")) for m in imported if m.role == "tool"] == [
        ("tool", DENIED, "denied")]
    assert any(type(v).__name__ == "ToolResultView" for v in window.chat.transcript.views)


def test_settings_tools_adds_servers_from_json_and_switches_built_ins_on(app_env, qtbot, monkeypatch, tmp_path):
    from app import dialogs
    from app.tools.config import BUILTINS

    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.show_tools_settings()
    card = window.tools_card
    assert "runs with your rights" in card.findChild(type(card.allowed), "toolsWarning").text()
    assert card.import_text("{not json").startswith("This is not JSON")
    assert "give a command" in card.import_text('{"mcpServers": {"x": {"args": []}}}')
    assert card.import_text(json.dumps({"mcpServers": {
        "test-tools": {"command": sys.executable, "args": [TEST_SERVER]},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}}}})) == ""
    card.builtin_switches["calculator-clock"].click()
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(dialogs, "folder_path", lambda *a: str(shared))
    card.builtin_switches["files"].click()
    saved = load_tool_settings()
    assert [s.name for s in saved.servers] == ["test-tools", "remote", "calculator-clock", "files"]
    assert saved.server("files").folder == str(shared) and set(BUILTINS) <= {s.builtin for s in saved.servers} | {""}
    found = {}
    window.toolbox.list_tools(["test-tools", "calculator-clock"], found.update)
    qtbot.waitUntil(lambda: len(found) == 2 and "Running" in card.status_labels["calculator-clock"].text(),
                    timeout=30_000)
    assert card.status_labels["test-tools"].text() == "Running: crash, hang, picture, set_lamp"
    assert card.status_labels["remote"].text() == "Starts when a chat uses it"
    card.builtin_switches["calculator-clock"].click()          # off: kept, but chats cannot use it
    assert load_tool_settings().server("calculator-clock").disabled
    assert "calculator-clock" not in [s.name for s in window.toolbox.usable()]
    page_screenshot(window.settings_page, "settings_tools")
    # the chat's tools menu lists what a chat may switch on
    window.chat._fill_tools_menu()
    texts = [a.text() for a in window.chat.tools_menu.actions()]
    assert "Tools work with a model loaded here (not a remote server)" in texts
