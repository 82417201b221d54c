"""Render a local HTML file in headless Chromium and report what a reader would see.

`open_page(path)` starts headless Chromium through Selenium (chromedriver from PATH), loads the
file, waits until the document and every image have finished loading, and returns a
`PageReport`: the title, each `<table>` (header texts, number of body rows), each `<img>` and
top-level inline `<svg>` (data URI or file, whether it loaded, its natural size: 0 means broken)
and the browser console's errors; with `screenshot=` it also writes a full-page PNG.
`Browser` is the same as a reusable session (one browser for many pages, e.g. a module-scoped
fixture); `screenshot_is_blank(png)` tells a page that rendered nothing from one that did.

Chromium and chromedriver are the Debian packages `chromium` and `chromium-driver`, installed by
`make setup` (scripts/ensure-chromium.sh). When they are missing this module raises
`BrowserUnavailable`, so tests that use it fail rather than skip.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

SETUP_HINT = "run make setup (scripts/ensure-chromium.sh)"
LOAD_TIMEOUT_S = 30.0
MAX_SCREENSHOT_HEIGHT = 16_384  # px; Chromium's own limit for one capture is about this

# Collects everything in one round trip once the page has loaded.
_COLLECT_JS = r"""
const norm = (s) => (s || "").replace(/\s+/g, " ").trim();
const kindOf = (src) => {
  if (!src) return "none";
  if (src.startsWith("data:")) return "data";
  if (src.startsWith("file:")) return "file";
  if (src.startsWith("http:") || src.startsWith("https:")) return "http";
  if (src.startsWith("blob:")) return "blob";
  return "other";
};
const tables = Array.from(document.querySelectorAll("table")).map((t) => {
  let headerRow = null;
  if (t.tHead && t.tHead.rows.length) {
    headerRow = t.tHead.rows[t.tHead.rows.length - 1];
  } else if (t.rows.length && t.rows[0].querySelector(":scope > th")
             && !t.rows[0].querySelector(":scope > td")) {
    headerRow = t.rows[0];
  }
  const headers = headerRow
    ? Array.from(headerRow.cells).map((c) => norm(c.textContent)) : [];
  const body = Array.from(t.rows).filter(
    (r) => r !== headerRow && !(r.parentElement && r.parentElement.tagName === "THEAD")
           && r.querySelector(":scope > td"));
  return {
    id: t.id || "",
    caption: t.caption ? norm(t.caption.textContent) : "",
    headers: headers,
    rows: body.length,
    total_rows: t.rows.length,
    cells: body.map((r) => Array.from(r.cells).map((c) => norm(c.textContent))),
  };
});
const images = Array.from(document.images).map((i) => {
  const src = i.currentSrc || i.src || "";
  return {
    tag: "img",
    src_kind: kindOf(src),
    src: src.length > 200 ? src.slice(0, 200) + "..." : src,
    alt: i.alt || "",
    complete: i.complete,
    natural_width: i.naturalWidth,
    natural_height: i.naturalHeight,
  };
});
const svgs = Array.from(document.querySelectorAll("svg"))
  .filter((s) => !(s.parentElement && s.parentElement.closest("svg")))
  .map((s) => {
    const box = s.getBoundingClientRect();
    return {
      tag: "svg",
      src_kind: "inline",
      src: "",
      alt: norm(s.getAttribute("aria-label") || (s.querySelector("title") || {}).textContent),
      complete: true,
      natural_width: Math.round(box.width),
      natural_height: Math.round(box.height),
    };
  });
return {
  title: document.title,
  url: document.URL,
  tables: tables,
  images: images.concat(svgs),
  text_length: norm(document.body ? document.body.innerText : "").length,
};
"""

_IMAGES_SETTLED_JS = r"""
return document.readyState === "complete"
  && Array.from(document.images).every((i) => i.complete);
"""


class BrowserUnavailable(RuntimeError):
    """Chromium or chromedriver is missing or would not start."""


@dataclass
class TableInfo:
    headers: list[str]  # texts of the header row's cells (last <thead> row, else a <th>-only row)
    rows: int  # body rows: rows with at least one <td>, outside <thead>
    total_rows: int  # every <tr> of the table, header rows included
    cells: list[list[str]]  # body cell texts, row by row
    id: str = ""
    caption: str = ""


@dataclass
class ImageInfo:
    tag: str  # "img" or "svg" (top-level inline SVG)
    src_kind: str  # "data", "file", "http", "blob", "other", "none"; "inline" for <svg>
    src: str  # the resolved source (data URIs cut to 200 characters); "" for <svg>
    alt: str
    complete: bool
    natural_width: int  # intrinsic size for <img> (0 = did not load), rendered size for <svg>
    natural_height: int

    @property
    def broken(self) -> bool:
        return self.natural_width == 0 or self.natural_height == 0


@dataclass
class PageReport:
    path: Path
    title: str
    url: str
    tables: list[TableInfo]
    images: list[ImageInfo]
    console_errors: list[str]  # SEVERE browser-log entries: failed loads, script errors
    text_length: int  # characters of visible body text
    screenshot: Path | None = None
    load_seconds: float = 0.0

    @property
    def n_tables(self) -> int:
        return len(self.tables)

    @property
    def rows_per_table(self) -> list[int]:
        return [table.rows for table in self.tables]

    @property
    def broken_images(self) -> list[ImageInfo]:
        return [image for image in self.images if image.broken]


def find_binaries() -> tuple[str, str]:
    """Paths of chromium and chromedriver; raises BrowserUnavailable naming what is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, found in (("chromium", chromium), ("chromedriver", driver))
               if not found]
    if missing:
        raise BrowserUnavailable(
            f"{' and '.join(missing)} not found on PATH: {SETUP_HINT} to install the Debian "
            "packages 'chromium' and 'chromium-driver'")
    assert chromium is not None and driver is not None
    return chromium, driver


class Browser:
    """One headless Chromium session; `open()` loads pages in it. Use as a context manager."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width = width
        self.height = height
        chromium, driver_path = find_binaries()
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ImportError as error:  # pragma: no cover - dev extra not installed
            raise BrowserUnavailable(
                f"selenium is not installed: {SETUP_HINT}; it is in the 'dev' extra") from error
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--hide-scrollbars",
                         "--force-device-scale-factor=1", "--no-first-run",
                         "--disable-extensions", "--allow-file-access-from-files",
                         f"--window-size={width},{height}"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        options.page_load_strategy = "normal"
        self._profile = tempfile.TemporaryDirectory(prefix="harness-chromium-")
        options.add_argument(f"--user-data-dir={self._profile.name}")
        try:
            self.driver = webdriver.Chrome(options=options,
                                           service=Service(executable_path=driver_path))
        except Exception as error:
            self._profile.cleanup()
            raise BrowserUnavailable(
                f"headless Chromium would not start ({chromium}, {driver_path}): {error}\n"
                f"{SETUP_HINT}; chromium and chromium-driver must be the same version"
            ) from error
        self.driver.set_page_load_timeout(LOAD_TIMEOUT_S)
        # --window-size counts the (invisible) window frame: pin the viewport itself instead.
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def open(self, html_path: Path | str, screenshot: Path | str | None = None) -> PageReport:
        """Load a local HTML file, wait for it and its images, and report what it shows."""
        path = Path(html_path).resolve()
        if not path.is_file():
            raise FileNotFoundError(path)
        driver = self.driver
        self.console_log()  # drop entries from earlier pages
        start = time.perf_counter()
        driver.get(path.as_uri())
        # Lazy images below the fold would never load in a fixed viewport: make them eager.
        driver.execute_script(
            "for (const i of document.images) { if (i.loading === 'lazy') i.loading = 'eager'; }")
        self._wait(lambda: bool(driver.execute_script(_IMAGES_SETTLED_JS)),
                   f"{path.name} did not finish loading its images")
        data = driver.execute_script(_COLLECT_JS)
        load_seconds = time.perf_counter() - start
        errors = [entry.get("message", "") for entry in self.console_log()
                  if entry.get("level") == "SEVERE"]
        shot = None
        if screenshot is not None:
            shot = Path(screenshot)
            self.screenshot(shot)
        return PageReport(
            path=path, title=data["title"], url=data["url"],
            tables=[TableInfo(**table) for table in data["tables"]],
            images=[ImageInfo(**image) for image in data["images"]],
            console_errors=errors, text_length=int(data["text_length"]),
            screenshot=shot, load_seconds=load_seconds)

    def console_log(self) -> list[dict[str, Any]]:
        """Browser-log entries since the last call (empty when the driver cannot give them)."""
        try:
            return list(self.driver.get_log("browser"))
        except Exception:  # pragma: no cover - depends on the driver
            return []

    def screenshot(self, png_path: Path) -> Path:
        """Full-page PNG of the current page (the whole document, not only the viewport)."""
        driver = self.driver
        metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        width = max(1, int(size["width"]))
        height = max(1, min(int(size["height"]), MAX_SCREENSHOT_HEIGHT))
        result = driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True, "fromSurface": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
        png_path.parent.mkdir(parents=True, exist_ok=True)
        png_path.write_bytes(base64.b64decode(result["data"]))
        return png_path

    def _wait(self, condition: Any, message: str) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message} within {LOAD_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_page(html_path: Path | str, screenshot: Path | str | None = None, width: int = 1400,
              height: int = 1000) -> PageReport:
    """Render one local HTML file in a fresh headless Chromium and report on it."""
    with Browser(width=width, height=height) as browser:
        return browser.open(html_path, screenshot=screenshot)


def screenshot_is_blank(png_path: Path | str, *, tolerance: int = 8,
                        min_fraction: float = 1e-4) -> bool:
    """True when (nearly) every pixel has the page's dominant colour.

    A pixel counts as drawn when any channel differs from the image's per-channel median by
    more than `tolerance` (0-255); the page is blank when fewer than `min_fraction` of the
    pixels are drawn (1e-4 of a 1400x1000 page is 140 pixels: less than one short word).
    """
    import numpy as np
    from PIL import Image

    with Image.open(png_path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    if pixels.size == 0:
        return True
    background = np.median(pixels.reshape(-1, 3), axis=0)
    drawn = (np.abs(pixels - background) > tolerance).any(axis=-1)
    return float(drawn.mean()) < min_fraction
