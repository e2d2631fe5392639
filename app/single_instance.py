"""One app per user: a second launch asks the first to come to the front, then exits."""

from __future__ import annotations

import getpass
import hashlib

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

CONNECT_MS = 500


def instance_key(data_dir: str) -> str:
    """Per user and data folder (tests with their own data folder do not collide)."""
    digest = hashlib.sha1(f"{getpass.getuser()}:{data_dir}".encode()).hexdigest()[:16]
    return f"qwendesk-{digest}"


class SingleInstance(QObject):
    activated = Signal()          # another launch asked this one to show itself

    def __init__(self, key: str, parent=None):
        super().__init__(parent)
        self.key = key
        self.server: QLocalServer | None = None

    def notify_running(self) -> bool:
        """True when another instance answered (it was asked to come to the front)."""
        socket = QLocalSocket()
        socket.connectToServer(self.key)
        if not socket.waitForConnected(CONNECT_MS):
            return False
        socket.write(b"show\n")
        socket.waitForBytesWritten(CONNECT_MS)
        socket.disconnectFromServer()
        return True

    def listen(self) -> bool:
        QLocalServer.removeServer(self.key)          # a stale socket file after a crash
        self.server = QLocalServer(self)
        self.server.newConnection.connect(self._on_connection)
        return self.server.listen(self.key)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def _on_connection(self) -> None:
        server = self.server
        while server is not None and server.hasPendingConnections():
            socket = server.nextPendingConnection()
            if socket.waitForReadyRead(CONNECT_MS) and bytes(socket.readAll().data()).startswith(b"show"):
                self.activated.emit()
            socket.disconnectFromServer()
            socket.deleteLater()
