"""The headless-Chromium helper (tests/browser.py) on small pages made here: a table, a PNG
data-URI image drawn by matplotlib, a broken image, and a blank page."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from tests.browser import (
    Browser,
    BrowserUnavailable,
    find_binaries,
    open_page,
    screenshot_is_blank,
)


def _png_data_uri() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(3, 2), dpi=100)
    axes.plot([0, 1, 2, 3], [1, 3, 2, 4], color="tab:blue")
    axes.set_title("accuracy")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Tiny report</title></head>
<body>
<h1>Results</h1>
<table id="results">
  <caption>Dev scores</caption>
  <thead><tr><th>Method</th><th>RTE</th><th>STS-B</th></tr></thead>
  <tbody>
    <tr><td>finetune</td><td>61.2</td><td>84.0</td></tr>
    <tr><td>kd</td><td>63.5</td><td>85.1</td></tr>
    <tr><td>pkd</td><td>64.0</td><td>85.9</td></tr>
  </tbody>
</table>
<img id="good" alt="learning curve" src="{data_uri}">
<img id="bad" alt="missing figure" src="missing.png">
<svg width="120" height="40" aria-label="bar"><rect width="100" height="30" fill="red"/></svg>
</body></html>
"""


@pytest.fixture(scope="module")
def browser():
    with Browser() as session:
        yield session


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pages")
    (root / "report.html").write_text(PAGE.replace("{data_uri}", _png_data_uri()))
    (root / "tall.html").write_text(
        "<!doctype html><html><body style='margin:0'><div style='height:3000px'></div>"
        "<div style='height:50px;background:#0000ff'></div></body></html>")
    (root / "blank.html").write_text(
        "<!doctype html><html><head><title>Blank</title>"
        "<style>html,body{margin:0;background:#fff}</style></head><body></body></html>")
    return root


def test_binaries_are_installed():
    chromium, driver = find_binaries()  # raises (fails) with the make-setup hint when missing
    assert Path(chromium).exists()
    assert Path(driver).exists()


def test_missing_binaries_fail_with_the_setup_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: nothing is found
    with pytest.raises(BrowserUnavailable, match=r"run make setup \(scripts/ensure-chromium.sh\)"):
        find_binaries()
    with pytest.raises(BrowserUnavailable, match="chromium and chromedriver not found"):
        Browser()


@pytest.mark.slow
def test_report_page_tables_images_and_screenshot(browser, page_dir, tmp_path):
    shot = tmp_path / "report.png"
    report = browser.open(page_dir / "report.html", screenshot=shot)

    assert report.title == "Tiny report"
    assert report.n_tables == 1
    table = report.tables[0]
    assert table.headers == ["Method", "RTE", "STS-B"]
    assert table.rows == 3 and report.rows_per_table == [3]
    assert table.total_rows == 4
    assert table.caption == "Dev scores" and table.id == "results"
    assert table.cells[1] == ["kd", "63.5", "85.1"]

    images = {image.alt: image for image in report.images}
    good, bad, svg = images["learning curve"], images["missing figure"], images["bar"]
    assert good.tag == "img" and good.src_kind == "data"
    assert good.complete and (good.natural_width, good.natural_height) == (300, 200)
    assert not good.broken
    assert bad.src_kind == "file" and bad.src.endswith("missing.png")
    assert bad.natural_width == 0 and bad.broken
    assert svg.tag == "svg" and svg.src_kind == "inline" and svg.natural_width == 120
    assert [image.alt for image in report.broken_images] == ["missing figure"]
    assert any("missing.png" in message for message in report.console_errors)

    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not screenshot_is_blank(shot)


def test_blank_page_screenshot_is_blank(browser, page_dir, tmp_path):
    shot = tmp_path / "blank.png"
    report = browser.open(page_dir / "blank.html", screenshot=shot)
    assert report.title == "Blank"
    assert report.n_tables == 0 and report.images == []
    assert report.console_errors == []  # the previous page's errors do not leak into this one
    assert report.text_length == 0
    assert screenshot_is_blank(shot)


def test_screenshot_covers_the_whole_page(browser, page_dir, tmp_path):
    import numpy as np
    from PIL import Image

    shot = tmp_path / "tall.png"
    browser.open(page_dir / "tall.html", screenshot=shot)
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == (3050, 1400, 3)  # beyond the 1000-px viewport
    assert tuple(pixels[-10, 10]) == (0, 0, 255)  # the block at the bottom is in it
    assert tuple(pixels[10, 10]) == (255, 255, 255)


@pytest.mark.slow
def test_open_page_one_shot(page_dir):
    report = open_page(page_dir / "blank.html", width=800, height=600)
    assert report.title == "Blank" and report.n_tables == 0


def test_missing_file_is_an_error(browser, tmp_path):
    with pytest.raises(FileNotFoundError):
        browser.open(tmp_path / "nope.html")
