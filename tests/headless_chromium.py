"""Open a local HTML file in headless Chromium and collect what a person would see: console
errors, uncaught exceptions, failed loads, CSP violations, and screenshots of the images.

Talks the DevTools protocol over ``--remote-debugging-pipe`` (file descriptors 3 and 4, one
NUL-terminated JSON message each way), so it needs only the ``chromium`` binary: no
websocket client, no browser-driver package, no network port.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
    "--disable-dev-shm-usage", "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageReport:
    """What loading one page produced."""

    console: list[dict] = field(default_factory=list)  # every console call: type + text
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)  # Log domain: network, security, CSP
    failed_requests: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)  # src kind, size, rect, screenshot PNG
    title: str = ""

    @property
    def errors(self) -> list[str]:
        """Everything that counts as a console error."""
        out = [f"console.{c['type']}: {c['text']}" for c in self.console
               if c["type"] in ("error", "assert")]
        return out + self.exceptions + self.log_errors + self.failed_requests


class CDPError(RuntimeError):
    pass


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int) -> None:
        self.proc = proc
        self.w = write_fd
        self.r = read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == want:
                if "error" in m:
                    raise CDPError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.events.append(self._read(deadline))
            except TimeoutError:
                return

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from chromium")
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise CDPError(f"chromium closed the pipe (exit code {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)


_IMAGES_JS = """
(() => Array.from(document.images).map(img => {
  img.scrollIntoView();
  const r = img.getBoundingClientRect();
  return {src: img.src.slice(0, 32), complete: img.complete, naturalWidth: img.naturalWidth,
          naturalHeight: img.naturalHeight, alt: img.alt,
          x: r.left + window.scrollX, y: r.top + window.scrollY,
          width: r.width, height: r.height};
}))()
"""


def _high_pipe() -> tuple[int, int]:
    """A pipe whose two ends are file descriptors >= 10."""
    import fcntl

    r, w = os.pipe()
    hr = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10)
    hw = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(r)
    os.close(w)
    return hr, hw


def inspect_page(path: str | Path, chromium: str | None = None, *, settle: float = 0.5,
                 timeout: float = 60.0, width: int = 1280, height: int = 900) -> PageReport:
    """Load ``path`` (a local file) in a fresh headless Chromium profile and report."""
    binary = chromium or find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium not found")
    url = Path(path).resolve().as_uri()
    cmd_r, cmd_w = _high_pipe()  # we write commands, chromium reads them on fd 3
    res_r, res_w = _high_pipe()  # chromium writes replies on fd 4, we read them
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as tmp:
        profile = Path(tmp) / "profile"
        log_path = Path(tmp) / "stderr.log"
        # both child ends are >= 10, so moving them onto 3 and 4 cannot clobber each other
        script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{res_w} {cmd_r}<&- {res_w}>&-'
        with open(log_path, "wb") as log:  # a file, not a pipe: a chatty browser never blocks
            proc = subprocess.Popen(
                ["bash", "-c", script, binary, *FLAGS, f"--user-data-dir={profile}",
                 f"--window-size={width},{height}", "about:blank"],
                pass_fds=(cmd_r, res_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(cmd_r)
        os.close(res_w)
        pipe = _Pipe(proc, cmd_w, res_r)
        try:
            return _run(pipe, url, settle, timeout)
        except (CDPError, TimeoutError, OSError) as e:
            proc.kill()
            proc.wait()
            err = log_path.read_bytes().decode(errors="replace")[-2000:]
            raise CDPError(f"{e}; chromium output:\n{err}") from None
        finally:
            if proc.poll() is None:
                try:
                    pipe.send("Browser.close", timeout=5)
                except (CDPError, TimeoutError, OSError):
                    pass
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            os.close(cmd_w)
            os.close(res_r)


def _run(pipe: _Pipe, url: str, settle: float, timeout: float) -> PageReport:
    target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True}
                        )["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.send(f"{domain}.enable", session=session)
    pipe.events.clear()
    pipe.send("Page.navigate", {"url": url}, session=session, timeout=timeout)
    pipe.wait_event("Page.loadEventFired", timeout=timeout)
    pipe.drain(settle)
    rep = PageReport()
    for e in pipe.events:
        if e.get("sessionId") not in (None, session):
            continue
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            rep.console.append({"type": p["type"], "text": text})
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            rep.exceptions.append(f"exception: {d.get('text')} "
                                  f"{d.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            rep.log_errors.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
        elif method == "Network.loadingFailed":
            rep.failed_requests.append(f"failed request: {p.get('errorText')} "
                                       f"({p.get('type', '')})")
    rep.title = pipe.send("Runtime.evaluate", {"expression": "document.title",
                                               "returnByValue": True},
                          session=session)["result"].get("value", "")
    imgs = pipe.send("Runtime.evaluate", {"expression": _IMAGES_JS, "returnByValue": True},
                     session=session)["result"]["value"]
    for img in imgs:
        shot = None
        if img["width"] > 0 and img["height"] > 0:
            clip = {"x": img["x"], "y": img["y"], "width": img["width"],
                    "height": img["height"], "scale": 1}
            shot = base64.b64decode(pipe.send(
                "Page.captureScreenshot", {"format": "png", "clip": clip,
                                           "captureBeyondViewport": True},
                session=session, timeout=timeout)["data"])
        rep.images.append(img | {"screenshot": shot})
    return rep


def drawn_fraction(png: bytes, background: tuple[int, int, int] = (255, 255, 255)) -> tuple[
        float, int]:
    """``(fraction of pixels that differ from the background, distinct colours)`` of a PNG: a
    drawn plot has axes, text and lines; a blank or failed image has one colour."""
    import io

    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    diff = np.abs(a - np.asarray(background, dtype=np.int16)).sum(-1) > 30
    colours = len(np.unique(a.reshape(-1, 3), axis=0))
    return float(diff.mean()), colours
