"""The head explorer in a real browser: Debian's headless Chromium, driven by Selenium through
`chromium-driver`, on the served page (`max-gpt2 explore`'s server, in this process) and on a standalone
file (`max-gpt2 heads --html`'s). It types text, hovers a token, clicks a head and exports a PNG, and
checks what changed: the highlighted tokens, the selected head's label, the pixels of the hovered
token's row in the drawn map; and that the standalone file asked for nothing over the network.
Skips, saying why, where Chromium, its driver or Selenium is missing (`.ci/run` installs Chromium)."""

from __future__ import annotations

import base64
import json
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from max_gpt2.explorer.app import EXAMPLE
from max_gpt2.explorer.browser import chromium_missing, headless_chromium
from max_gpt2.explorer.data import explore
from max_gpt2.explorer.page import page
from max_gpt2.explorer.server import explorer_server

TEXT = "The cat sat on the mat. The cat sat."
CELL, LABEL = 44, 28  # the model view's layout (static/explorer.js)
HOVER_ROW, ROW_TINT = (255, 0, 0), 0.35  # the hovered token's row in the head view


class By:
    """Selenium's locator strategies (`selenium.webdriver.common.by.By`), without importing it here."""

    ID, CSS_SELECTOR, TAG_NAME = "id", "css selector", "tag name"


pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = headless_chromium(1400, 2400, script_timeout=60, log_requests=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(explorer_app) -> Iterator[str]:
    server = explorer_server(explorer_app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def wait_for(driver: Any, condition: str, timeout: float = 120) -> Any:
    """Waits until the JavaScript expression `condition` is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(f"return {condition}"))


def requests_made(driver: Any) -> list[str]:
    """The URLs the page asked for since the last call (Chrome's performance log)."""
    entries = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    return [e["params"]["request"]["url"] for e in entries if e["method"] == "Network.requestWillBeSent"]


def row_pixels(driver: Any, row: int) -> np.ndarray:
    """The head view's drawn row `row`: uint8 [tokens, RGBA]."""
    data = driver.execute_script(
        "const c = document.getElementById('head-map');"
        "return Array.from(c.getContext('2d').getImageData(0, arguments[0], c.width, 1).data);",
        row,
    )
    return np.array(data, np.uint8).reshape(-1, 4)


def painted(weights: np.ndarray) -> np.ndarray:
    """The colour a weight (0..255) is drawn in: white to blue (static/explorer.js `paint`)."""
    w = weights.astype(np.float64)
    return np.stack([255 - w, 255 - np.round(w * 0.6), np.full_like(w, 255)], axis=-1)


def exercise(driver: Any, length: int, weights_of: Any) -> None:
    """Clicks a head in the model view, hovers a token and exports a PNG; checks each change.
    `weights_of(layer, head)`: that head's map, uint8 [length, length], as the page has it."""
    from selenium.webdriver.common.action_chains import ActionChains

    layer, head = 1, 3
    model_view = driver.find_element(By.ID, "model-view")
    box = model_view.rect
    x, y = LABEL + head * CELL + CELL / 2, LABEL + layer * CELL + CELL / 2  # the cell's centre, in pixels
    ActionChains(driver).move_to_element_with_offset(
        model_view, int(1 + x - box["width"] / 2), int(1 + y - box["height"] / 2)
    ).click().perform()
    wait_for(
        driver, f"document.getElementById('head-label').textContent.startsWith('layer {layer} head {head}:')"
    )
    label = driver.find_element(By.ID, "head-label").text
    assert "previous-token" in label and "induction" in label
    assert driver.find_element(By.ID, "layer").get_attribute("value") == str(layer)
    assert driver.find_element(By.ID, "head").get_attribute("value") == str(head)

    weights = weights_of(layer, head)
    hovered = length - 3
    before = row_pixels(driver, hovered)
    np.testing.assert_allclose(before[:, :3], painted(weights[hovered]), atol=1)  # the map as it is
    tokens = driver.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert len(tokens) == length
    ActionChains(driver).move_to_element(tokens[hovered]).perform()
    wait_for(driver, f"document.querySelectorAll('#tokens .token')[{hovered}].classList.contains('hovered')")

    after = row_pixels(driver, hovered)  # the hovered row, tinted
    others = [j for j in range(length) if j != hovered]  # (its column is tinted too)
    expected = painted(weights[hovered]) * (1 - ROW_TINT) + np.array(HOVER_ROW) * ROW_TINT
    np.testing.assert_allclose(after[others, :3], expected[others], atol=2)
    assert not np.array_equal(after, before)
    untouched = row_pixels(driver, 1)
    np.testing.assert_allclose(untouched[others, :3], painted(weights[1])[others], atol=1)  # another row

    backgrounds = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .token'), s => s.style.backgroundColor);"
    )
    for j in range(hovered + 1):  # where the hovered token looks: blue, as strong as its weight
        out, into = weights[hovered, j], weights[j, hovered]
        if out >= into and out > 0:
            alpha = float(backgrounds[j].rsplit(",", 1)[1].rstrip(")")) if "rgba" in backgrounds[j] else 1.0
            assert backgrounds[j].startswith("rgba(90, 140, 255") and abs(alpha - out / 255) < 0.01, j
    assert "#" in driver.find_element(By.ID, "token-info").text

    driver.find_element(By.ID, "export-png").click()
    exported = wait_for(driver, "window.lastExport")
    assert exported["name"] == f"head-{layer}-{head}.png"
    png = base64.b64decode(exported["url"].removeprefix("data:image/png;base64,"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (length, length)  # IHDR: one pixel a weight
    driver.find_element(By.ID, "export-json").click()
    wait_for(driver, "window.lastExport.name === 'exploration.json'")


def test_the_served_page_explores_typed_text(browser, served, explorer_app):
    browser.get(served)
    typed = browser.find_element(By.ID, "text")
    typed.send_keys(TEXT)
    browser.find_element(By.ID, "explore").click()
    wait_for(
        browser,
        "!document.getElementById('results').hidden && document.getElementById('head-label').textContent",
    )
    ids = np.array(explorer_app.lm.tokenizer.encode(TEXT).ids)
    attentions = explorer_app.lm.attentions(ids[None])[:, 0]
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .token'), s => s.textContent).join('');"
    )
    assert shown == TEXT
    rows = browser.find_elements(By.CSS_SELECTOR, "#probabilities tbody tr")
    assert len(rows) == len(ids) and rows[1].find_elements(By.TAG_NAME, "td")[2].text != ""

    exercise(browser, len(ids), lambda layer, head: np.rint(attentions[layer, head] * 255).astype(np.uint8))

    typed.clear()
    browser.find_element(By.ID, "explore").click()
    error = wait_for(
        browser, "!document.getElementById('error').hidden && document.getElementById('error').textContent"
    )
    assert error == "the text is empty: type or paste some"
    browser.find_element(By.ID, "example").click()  # and the server serves on
    wait_for(
        browser,
        f"document.getElementById('error').hidden && "
        f"document.querySelectorAll('#tokens .token').length === {2 * EXAMPLE}",
    )


def test_the_standalone_file_explores_offline(browser, explorer_app, tmp_path):
    ids = np.array(explorer_app.lm.tokenizer.encode(TEXT).ids)
    exploration = explore(explorer_app.lm, ids, explorer_app.lm.tokenizer)
    file = tmp_path / "heads.html"
    file.write_text(page(data=exploration.summary(with_maps=True)), encoding="utf-8")

    requests_made(browser)  # what came before
    browser.get(file.as_uri())
    wait_for(browser, "document.getElementById('head-label').textContent")
    assert not browser.find_element(By.ID, "input").is_displayed()  # one text: nothing to type
    exercise(
        browser,
        len(ids),
        lambda layer, head: np.rint(exploration.attentions[layer, head] * 255).astype(np.uint8),
    )
    browser.find_element(By.ID, "head").send_keys("mean")  # the layer's mean, from the maps inside
    wait_for(browser, "document.getElementById('head-label').textContent.includes('the mean of its')")

    asked = requests_made(browser)
    assert file.as_uri() in asked  # the log sees the page's own request...
    elsewhere = [url for url in asked if not url.startswith(("file:", "data:", "blob:"))]
    assert elsewhere == []  # ...and no other
