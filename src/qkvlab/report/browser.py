"""Open a report in headless Chromium and check it, over the DevTools protocol (stdlib only).

Chromium is started offline-safe (no sandbox, GPU, QUIC, first-run, background networking,
component updates or sync; a fresh profile), on a DevTools port it picks itself. A minimal
RFC 6455 websocket client (text frames, client masking) speaks CDP to one page: it loads the
file, collects console errors and exceptions, reads every image's ``naturalWidth``, lists the
sections, and saves a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--window-size=1280,900", "--hide-scrollbars"]
INSTALL_HINT = ("Chromium is not installed: on Debian/Ubuntu run "
                "`apt-get update && apt-get install -y chromium` (then /usr/bin/chromium exists), "
                "or set QKVLAB_CHROMIUM to a Chromium/Chrome binary")


def find_chromium() -> str:
    """Path of a Chromium binary; FileNotFoundError with the install command if none."""
    for c in (os.environ.get("QKVLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if c and (shutil.which(c) or Path(c).is_file()):
            return shutil.which(c) or c
    raise FileNotFoundError(INSTALL_HINT)


class _WebSocket:
    """Just enough of a websocket client for CDP: masked text frames out, frames in."""

    def __init__(self, url: str, timeout: float = 30.0):
        assert url.startswith("ws://"), url
        hostport, path = url[5:].split("/", 1)
        host, port = hostport.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket: connection closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket: handshake refused: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        hdr = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                               bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                               bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("websocket: connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)  # the server does not mask
            op = b0 & 0x0F
            if op == 0x8:
                raise ConnectionError("websocket: closed by the browser")
            if op in (0x1, 0x0, 0x2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class Page:
    """One Chromium page over CDP: ``call(method, **params)``; events are kept in ``events``."""

    def __init__(self, ws_url: str):
        self.ws, self.next_id, self.events = _WebSocket(ws_url), 0, []

    def call(self, method: str, timeout: float = 30.0, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        end = time.time() + timeout
        while time.time() < end:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)
        raise TimeoutError(f"CDP {method}: no answer in {timeout} s")

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        end = time.time() + timeout
        while time.time() < end:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(f"CDP: no {method} in {timeout} s")


def check_page(index: Path, screenshot: Path, timeout: float = 60.0) -> dict:
    """Load ``index`` in headless Chromium and report what a reader would see.

    Returns:
        ``{"images": [{src, naturalWidth, complete}], "sections": [ids], "errors": [text],
        "title": str, "screenshot": path}``; ``errors`` holds console errors, uncaught
        exceptions and failed loads.

    Raises:
        FileNotFoundError: no Chromium (the message says how to install it) or no ``index``.
    """
    index = Path(index).resolve()
    if not index.is_file():
        raise FileNotFoundError(f"{index}: no such report")
    binary = find_chromium()
    profile = tempfile.mkdtemp(prefix="qkvlab-chromium-")
    proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file, end = Path(profile) / "DevToolsActivePort", time.time() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None or time.time() > end:
                raise RuntimeError(f"chromium did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        page = Page(target["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Page.navigate", url=index.as_uri())
        page.wait_event("Page.loadEventFired", timeout)
        info = page.call("Runtime.evaluate", returnByValue=True, expression="""({
            images: Array.from(document.images).map(i => ({src: i.getAttribute('src'),
                     naturalWidth: i.naturalWidth, complete: i.complete})),
            sections: Array.from(document.querySelectorAll('section[id]')).map(s => s.id),
            title: document.title})""")["result"]["value"]
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        screenshot = Path(screenshot)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for e in page.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                      for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                errors.append(f"network: {p.get('errorText')} ({p.get('requestId')})")
        page.ws.close()
        return {**info, "errors": errors, "screenshot": str(screenshot)}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
