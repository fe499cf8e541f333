"""A real browser for the report tests: headless Debian ``chromium`` driven over the DevTools protocol (a
websocket, spoken with aiohttp): load a page, evaluate JavaScript, collect console errors, take a screenshot.

``chromium()`` skips the calling test (one line why) when the browser is missing, or fails it under
``REPRO_REQUIRE_BROWSER=1`` (CI installs chromium and sets it)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest


def chromium() -> str:
    """The browser's executable; skips (or fails under REPRO_REQUIRE_BROWSER=1) when there is none."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        reason = "no chromium here (apt-get install chromium; .ci/run installs it)"
        if os.environ.get("REPRO_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REPRO_REQUIRE_BROWSER=1: {reason}")
        pytest.skip(reason)
    return path


class Page:
    """One tab of a headless chromium: ``async with Page(exe, width, height) as page``."""

    def __init__(self, executable: str, width: int, height: int) -> None:
        self.executable, self.width, self.height = executable, width, height
        self.errors: list[str] = []  # console errors, uncaught exceptions, failed loads
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._events: asyncio.Queue = asyncio.Queue()

    async def __aenter__(self) -> Page:
        self._profile = tempfile.mkdtemp(prefix="repro-chromium-")
        self._proc = subprocess.Popen(
            [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-port=0", f"--user-data-dir={self._profile}",
             f"--window-size={self.width},{self.height}", "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = await self._devtools_port()
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json(content_type=None)
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                        deviceScaleFactor=1, mobile=False)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._reader.cancel()
        await self._ws.close()
        await self._session.close()
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        shutil.rmtree(self._profile, ignore_errors=True)

    async def _devtools_port(self, timeout_s: float = 60.0) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode} before it listened")
            await asyncio.sleep(0.1)
        raise TimeoutError("chromium did not open its DevTools port")

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self._record(data)
            await self._events.put(data)

    def _record(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = (str(a.get("value", a.get("description"))) for a in params["args"])
            self.errors.append("console: " + " ".join(args))
        elif method == "Runtime.exceptionThrown":
            self.errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def open(self, url: str) -> None:
        """Navigate and wait for the load event (images included)."""
        await self.send("Page.navigate", url=url)
        while True:
            event = await asyncio.wait_for(self._events.get(), 60)
            if event.get("method") == "Page.loadEventFired":
                return

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        return base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])


def small_png(data: bytes, path: Path) -> Path:
    """``data`` (a PNG) written to ``path`` with at most 256 colours, optimized (a README image stays small)."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)
    image.save(path, format="PNG", optimize=True)
    return path
