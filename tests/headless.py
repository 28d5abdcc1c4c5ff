"""A headless Chromium driven over the DevTools protocol on a pipe (no port, no extra package):
open a page, wait until a JavaScript expression is true, take a screenshot.

`--screenshot` alone cannot wait for a page that streams: it shoots when the virtual-time
budget runs out, mid-reply."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def find_chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _high(fd: int) -> int:
    """The same pipe end on a descriptor >= 10, clear of the 3 and 4 the browser expects."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Browser:
    def __init__(self, binary: str, width: int = 1000, height: int = 800):
        self._profile = tempfile.mkdtemp(prefix="mtpspec-chromium-")
        to_chrome_r, self._to_chrome = map(_high, os.pipe())
        self._from_chrome, from_chrome_w = map(_high, os.pipe())
        # The browser reads commands on fd 3 and writes replies on fd 4: let bash put the pipe ends there.
        redirect = f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-'
        self._proc = subprocess.Popen(
            ["bash", "-c", redirect, binary, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self._session: str | None = None

    def _send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 20.0) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError(f"no reply to {method} in {timeout} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buf += chunk

    def open(self, url: str) -> None:
        pages = [t for t in self._send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        tid = pages[0]["targetId"] if pages else self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        self._send("Page.navigate", {"url": url}, self._session)

    def evaluate(self, expression: str) -> object:
        r = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self._session)
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return True
            time.sleep(0.1)
        return False

    def screenshot(self, path: Path) -> Path:
        data = self._send("Page.captureScreenshot", {"format": "png"}, self._session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self._profile, ignore_errors=True)
