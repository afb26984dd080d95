"""Model Explorer, started as a user starts it (`model-explorer FILE --extensions=etlab.model_explorer`, on
127.0.0.1, bounded lifetime), opens upstream's XNNPACK .etrecord through etlab's adapter with a latency
overlay exported by `etlab export-me`, in headless Debian chromium: the graph is drawn and its nodes are
coloured by the overlay's gradient (screenshots in /tmp/etlab_screens)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from etlab.model_explorer._show import start
from tests.interop.test_upstream_xnnpack_views import xnnpack  # noqa: F401  (the upstream files' fixture)

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("browser")]

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
SCREENS = Path("/tmp/etlab_screens")
HOT = (0xB3, 0x00, 0x00)  # the gradient's top colour (etlab.model_explorer._node_data.WARM[-1])


def colours(png: bytes, width_share: float = 0.7) -> Counter:
    """Pixel colours of the graph area (left of Model Explorer's side panel, below its toolbar)."""
    from io import BytesIO

    from PIL import Image

    im = Image.open(BytesIO(png)).convert("RGB")
    w, h = im.size
    return Counter({c: n for n, c in im.crop((0, 100, int(w * width_share), h)).getcolors(1 << 24)})


def near(c: tuple[int, int, int], ref: tuple[int, int, int], tol: int = 12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(c, ref))


def test_model_explorer_draws_upstream_xnnpack_record_with_latency(xnnpack, tmp_path):  # noqa: F811
    etlab = str(Path(sys.executable).with_name("etlab"))
    out = tmp_path / "me"
    out.mkdir()
    r = subprocess.run([etlab, "export-me", str(xnnpack / "run.etdp"), "--etrecord", str(xnnpack / "model.etrecord"),
                        "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    session = start([str(xnnpack / "model.etrecord")], [str(out / "latency_p50.json")], timeout=300)
    try:
        assert any("ExecuTorch (etlab)" in line for line in session.log), session.log
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(session.url, timeout=120_000)
            page.get_by_text("latency p50 (ms)").first.wait_for(timeout=180_000)
            hot, shot = 0, b""
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:  # WebGL draws after the data arrives
                shot = page.screenshot()
                hot = sum(n for c, n in colours(shot).items() if near(c, HOT))
                if hot > 200:
                    break
                time.sleep(2)
            SCREENS.mkdir(parents=True, exist_ok=True)
            (SCREENS / "model_explorer_upstream_xnnpack.png").write_bytes(shot)
            body = page.inner_text("body")
            browser.close()
        assert hot > 200, "no node coloured by the latency overlay's top colour"
        assert "model.etrecord" in body and "forward (Edge)" in body
        assert "features (Sequential)" in body  # the module layer (it holds the XNNPACK partition)
    finally:
        session.stop()
    assert session.process.poll() is not None
