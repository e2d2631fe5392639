"""A conversation reopened after the app restarts: its cache comes back from the engine's disk tier before the user
sends anything (the real engine thread, a tiny checkpoint, the disk tier under the test's cache folder)."""

from pathlib import Path

from tests.app_support import make_context, open_window, screenshot, seeded_replies, send, wait_ready, wait_reply


def test_reopened_conversation_warms_its_cache_from_disk(app_env, qtbot, checkpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("QWENDESK_CACHE_DIR", str(tmp_path / "cache"))     # this test's own disk tier
    seeded_replies(monkeypatch)
    path = checkpoint("base")
    settings = dict(last_model=str(path), max_tokens=8, thinking=False, model_folders=[str(Path(path).parent)])
    window = open_window(qtbot, make_context(app_env, **settings))
    wait_ready(qtbot, window)
    send(qtbot, window, "Tell me a long story about a lighthouse keeper " * 12)
    wait_reply(qtbot, window)
    conversation = window.session.current.id
    window.shutdown()                                   # the engine finishes its disk writes as it closes
    window.close()

    again = open_window(qtbot, make_context(app_env, **settings))
    wait_ready(qtbot, again)
    warmed = []
    again.session.cache_warmed.connect(warmed.append)
    again.session.open(conversation)
    qtbot.waitUntil(lambda: bool(warmed), timeout=20_000)
    assert warmed[0] > 0, "the reopened conversation found its pages on disk"
    assert again.chat.gauge.cached_text.isVisible() and "cached" in again.chat.gauge.cached_text.text()
    screenshot(again, "chat_cache_warmed")
    send(qtbot, again, "And then?")
    wait_reply(qtbot, again)
    reply = again.context.store.messages(conversation)[-1]
    assert reply.role == "assistant" and reply.status == "complete"
    assert not again.chat.gauge.cached_text.isVisible()
