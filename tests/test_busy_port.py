"""Issue 47, item 7: a port in use. qwendesk-serve said nothing of it (it loaded the model, then aborted with exit
134); the app said "the HTTP server did not start" and left its switch on. One default port for both."""

import socket
import subprocess
import sys

import pytest

from app.settings import AppSettings
from engine.api import DEFAULT_PORT
from engine.server.cli import parse_args as serve_args
from tests.app_support import make_context, open_window, page_screenshot, wait_ready


@pytest.fixture
def busy_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    yield holder.getsockname()[1]
    holder.close()


def test_serve_says_the_port_is_in_use_before_loading_anything(busy_port, checkpoint):
    proc = subprocess.run([sys.executable, "-m", "engine.server.cli", "--model", str(checkpoint("base")),
                           "--device", "cpu", "--port", str(busy_port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"qwendesk-serve: error: port {busy_port} on 127.0.0.1 is already in use by another program"]


def test_the_app_says_the_port_is_in_use_and_turns_its_switch_off(app_env, qtbot, checkpoint, busy_port):
    context = make_context(app_env, last_model=str(checkpoint("base")), endpoint_port=busy_port)
    window = open_window(qtbot, context)
    wait_ready(qtbot, window)
    window.show_page("settings")
    page = window.settings_page
    with qtbot.waitSignal(window.engine.endpoint_changed, timeout=30_000) as changed:
        page.endpoint_enabled.setChecked(True)
    status = changed.args[0]
    assert not status.running and f"port {busy_port} on 127.0.0.1 is already in use" in status.message
    assert page.endpoint_status.text() == status.message
    assert not page.endpoint_enabled.isChecked() and not window.context.settings.endpoint_enabled
    page_screenshot(page, "settings_endpoint_port_in_use")


def test_one_default_port():
    args, _ = serve_args(["--model", "Qwen/Qwen3.5-0.8B"])
    assert AppSettings().endpoint_port == args.port == DEFAULT_PORT
