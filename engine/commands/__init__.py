"""Command lines: qwendesk-chat, and the argument checks it shares with qwendesk-serve and qwendesk-bench."""
