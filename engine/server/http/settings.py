"""ServerSettings: how the HTTP API is exposed (address, key, allowed hosts, CORS, limits)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from engine.api import DEFAULT_PORT

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass
class ServerSettings:
    model_id: str = "qwen"                  # the name clients pass as `model`
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None              # required on /v1 routes and /metrics when set
    allowed_hosts: list[str] = field(default_factory=list)  # Host header names beyond loopback; "*": any
    cors_origins: list[str] = field(default_factory=list)   # browser origins allowed (none: CORS off); "*": any
    max_body_bytes: int = 32 * 1024 * 1024
    keepalive_s: float = 15.0               # SSE keep-alive while a request waits or thinks silently
    stream_interval_s: float = 0.0          # least time between a stream's chunks (tokens in between go as one)
    allow_image_urls: bool = False          # fetch http(s) image URLs (off: data: URLs / base64 only)
    image_url_timeout_s: float = 10.0       # the whole fetch of one image URL
    special_tokens: str = "auto"            # text | control | auto (text when listening beyond loopback): what
    #                                         special-token text (<|im_start|>, <tool_call>) in messages becomes
    prepare_threads: int = 2                # threads preparing requests (templates, tokenizing, images; workers.py)
    prepare_queue: int = 32                 # requests waiting for them before 503
    grammar_timeout_s: float = 10.0         # compiling a request's structured output / tools grammar (400 beyond)
    # connections (connections.py): what a client can hold before its key is checked
    max_connections: int = 512              # open in all (and never over half the process's file limit)
    max_connections_per_client: int = 128   # open from one client address
    header_timeout_s: float = 10.0          # a request's line and headers must arrive within this
    max_header_bytes: int = 64 * 1024       # request line + headers (431 beyond)
    body_timeout_s: float = 30.0            # a request body that stops arriving this long is cut (408)
    idle_timeout_s: float = 5.0             # a kept-alive connection with no request in progress is closed after

    def host_allowed(self, host: str) -> bool:
        """A DNS rebinding attack needs a name the attacker controls, so a literal IP address is
        always safe; a name must be a loopback one, the bound host, or listed in allowed_hosts."""
        name = hostname(host)
        if name is None:                    # not a Host header at all ("127.0.0.1:80@evil.example", "[::1")
            return False
        allowed = [hostname(h) for h in self.allowed_hosts] + [hostname(self.host)]
        if "*" in self.allowed_hosts or name in LOOPBACK_NAMES or name in allowed:
            return True
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False


    @property
    def special_text(self) -> bool:
        """Special-token text in chat messages is plain text (a client cannot write another role's turn)."""
        return self.special_tokens == "text" or (self.special_tokens == "auto" and not is_loopback(self.host))

    @property
    def origins(self) -> list[str]:
        """The allowed web origins as browsers write them ("http://app.local:3000": lower case, no slash)."""
        return [origin_name(o) for o in self.cors_origins]

    def origin_allowed(self, origin: str) -> bool:
        """A request from a web page (it carries Origin) is accepted only from a listed origin."""
        allowed = self.origins
        return "*" in allowed or origin_name(origin) in allowed


def origin_name(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


def hostname(host: str) -> str | None:
    """A Host header's name, without its port: "LocalHost:8080" -> "localhost", "[::1]:80" -> "::1"; None when it is
    not host[:port] (RFC 9110: a name of letters, digits, '-', '.', '_', or an IP literal; the port digits)."""
    value = host.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name, rest = (value[1:end], value[end + 1:]) if end > 0 else ("", "")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    elif value.count(":") > 1:                  # a bare IPv6 address (the --host option's form)
        name, rest = value, ""
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
        if not re.fullmatch(r"[a-z0-9._-]+", name):
            return None
    if rest and not re.fullmatch(r":[0-9]{0,5}", rest):
        return None
    return name


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
