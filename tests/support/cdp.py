"""A headless Chromium driven over the DevTools protocol, with a minimal WebSocket client.

No WebSocket library is a dependency, so this speaks just what CDP needs (RFC 6455 on a
raw loopback socket): the upgrade, masked text frames out, unmasked text frames in
(continuations joined), ping answered, close. One page target, one command at a time.

    with Chromium(tmp_path) as browser:
        page = browser.page()
        page.navigate("http://127.0.0.1:8080/")
        assert page.wait_for("document.title", lambda t: t == "agent pool") == "agent pool"
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_binary() -> str | None:
    """The headless browser of this machine, if one is installed."""
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


class WebSocket:
    """A client WebSocket over a plain TCP socket (loopback `ws://` only)."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                msg = "the browser closed the connection during the upgrade"
                raise ConnectionError(msg)
            head += chunk
        status, _, self.buffer = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n", 1)[0]:
            msg = f"no WebSocket upgrade: {status[:80]!r}"
            raise ConnectionError(msg)

    def send(self, text: str) -> None:
        """One masked text frame."""
        payload = text.encode()
        size = len(payload)
        header = bytes([0x81])
        if size < 126:
            header += bytes([0x80 | size])
        elif size < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", size)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", size)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                msg = "the browser closed the WebSocket"
                raise ConnectionError(msg)
            self.buffer += chunk
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        return taken

    def receive(self) -> str:
        """The next text message (a ping is answered on the way)."""
        parts: list[bytes] = []
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", self._exactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self._exactly(8))[0]
            payload = self._exactly(size)
            opcode = first & 0x0F
            if opcode == 0x8:
                msg = "the browser closed the WebSocket"
                raise ConnectionError(msg)
            if opcode == 0x9:  # ping: pong with the same payload (sent masked, as a client must)
                mask = os.urandom(4)
                pong = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                self.sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + pong)
                continue
            parts.append(payload)
            if first & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        """Drop the connection (the browser is stopped next anyway)."""
        self.sock.close()


class Page:
    """One page target: navigate, evaluate, wait for a value."""

    def __init__(self, url: str, timeout: float) -> None:
        self.socket = WebSocket(url, timeout)
        self.timeout = timeout
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are dropped)."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.receive())
            if message.get("id") == self.next_id:
                if "error" in message:
                    msg = f"{method}: {message['error']}"
                    raise RuntimeError(msg)
                result: dict[str, Any] = message["result"]
                return result

    def navigate(self, url: str) -> None:
        """Open `url` in the page."""
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able), awaited."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            msg = f"{expression[:60]}: {result['exceptionDetails'].get('text')}"
            raise RuntimeError(msg)
        return result["result"].get("value")

    def wait_for(self, expression: str, ready: Callable[[Any], bool], timeout: float = 15) -> Any:
        """Evaluate `expression` until `ready(value)`; fail after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is still loading: its script is not there yet
            if ready(value):
                return value
            time.sleep(0.1)
        msg = f"not ready after {timeout} s: {expression[:80]} -> {value!r}"
        raise TimeoutError(msg)


class Chromium:
    """Headless Chromium on a DevTools port of its choosing, in a profile under `root`."""

    def __init__(self, root: Path, binary: str, timeout: float = 20) -> None:
        self.root = root
        self.binary = binary
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.pages: list[Page] = []

    def __enter__(self) -> Self:
        profile = self.root / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        log = (self.root / "chromium.log").open("wb")
        argv = [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                f"--user-data-dir={profile}", "about:blank"]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.endpoint = self._listening()
        return self

    def _listening(self) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            found = _LISTENING.search((self.root / "chromium.log").read_text(errors="replace"))
            if found:
                parts = urlsplit(found.group(1))
                return f"http://{parts.netloc}"
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.1)
        msg = f"chromium did not open its DevTools port: {self.log()[-2000:]}"
        raise RuntimeError(msg)

    def log(self) -> str:
        """What the browser printed."""
        return (self.root / "chromium.log").read_text(errors="replace")

    def page(self) -> Page:
        """The browser's first page target, attached."""
        targets = httpx.get(f"{self.endpoint}/json/list", timeout=self.timeout).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        page = Page(url, self.timeout)
        self.pages.append(page)
        return page

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for page in self.pages:
            page.socket.close()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait(10)
