"""Every chat backend has all of app/backend.py's ChatBackend: the session calls them without asking (no hasattr)."""

from app.backend import ChatBackend
from app.engine_thread import EngineThread
from app.remote_client import RemoteBackend
from tests.app_support import ScriptedBackend


def test_every_backend_is_a_chat_backend(qapp):
    thread = EngineThread()
    try:
        for backend in (thread, RemoteBackend("http://127.0.0.1:9"), ScriptedBackend([("Hi.", "")])):
            assert isinstance(backend, ChatBackend), type(backend).__name__
            assert backend.count_tokens([{"role": "user", "content": "x"}], {}) is None     # nothing to count with
    finally:
        assert thread.shutdown()
    assert not isinstance(object(), ChatBackend)
