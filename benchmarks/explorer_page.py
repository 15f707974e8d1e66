"""The head explorer in headless Chromium: how long a long text takes to show, and a screenshot.

    python benchmarks/explorer_page.py --checkpoint DIR --tokens 1024      # timings at 1024 tokens
    python benchmarks/explorer_page.py --checkpoint DIR --text "..." --screenshot docs/explorer.png

Loads the checkpoint into the explorer (`ExplorerApp.load`), serves it on a free local port and
drives Debian's Chromium through Selenium (`chromium`, `chromium-driver`): explores a text of
`--tokens` tokens (the corpus the package ships, repeated and cut to length) or `--text`, or the induction
example (`--example`), then times, in the page, what a reader does: the first drawing (model
view, head view, tables), opening another head (its map fetched and drawn), averaging a layer,
and hovering a token. Prints one JSON object; `--screenshot` saves the window as a PNG, the
likeliest induction head open and a token (`--hover`) hovered.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from max_gpt2.bench.server import free_port
from max_gpt2.explorer.app import ExplorerApp
from max_gpt2.explorer.browser import chromium_missing, headless_chromium
from max_gpt2.explorer.server import explorer_server
from max_gpt2.testing import CORPUS


def timed(driver, script: str) -> float:
    """Milliseconds the page takes to run `script` (an async body; `done()` is called after it)."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; const start = performance.now();"
        f"(async () => {{ {script} }})().then(() => done(performance.now() - start), (e) => done(String(e)));"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--weight-format", default=None)
    parser.add_argument("--tokens", type=int, default=1024, help="the text's length (default: 1024)")
    parser.add_argument("--text", help="explore this text instead")
    parser.add_argument("--example", action="store_true", help="explore the induction example instead")
    parser.add_argument("--screenshot", type=Path, help="save the window here, as PNG")
    parser.add_argument(
        "--hover", type=int, default=-1, help="the token hovered in the screenshot (default: last)"
    )
    parser.add_argument("--size", default="1280x1600", help="the window, WIDTHxHEIGHT (default: 1280x1600)")
    args = parser.parse_args()
    if missing := chromium_missing():
        sys.exit(f"the browser cannot run here: {missing}")

    app = ExplorerApp.load(args.checkpoint, "cpu", "float32", args.weight_format)
    if args.example:
        request = {"example": "induction"}
    else:
        text = args.text
        if text is None:
            corpus = app.lm.tokenizer.encode(CORPUS.read_text(encoding="utf-8")).ids
            ids = (corpus * (args.tokens // len(corpus) + 1))[: args.tokens]  # repeated as needed
            text = app.lm.tokenizer.decode(ids)
        request = {"text": text}
    server = explorer_server(app, "127.0.0.1", free_port())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    width, height = (int(part) for part in args.size.split("x"))
    driver = headless_chromium(width, height, script_timeout=600)
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        start = time.perf_counter()
        summary = app.explore(request)  # the server's side alone, for the split
        server_ms = 1000 * (time.perf_counter() - start)
        first = timed(driver, f"await exploreWith({json.dumps(request)});")
        last_layer, last_head = summary["layers"] - 1, summary["heads"] - 1
        result = {
            "tokens": len(summary["tokens"]),
            "layers": summary["layers"],
            "heads": summary["heads"],
            "summary_bytes": len(json.dumps(summary)),
            "server_ms": round(server_ms),
            "first_view_ms": round(first) if isinstance(first, float) else first,
            "open_head_ms": round(timed(driver, f"await openHead({last_layer}, {last_head});")),
            "layer_mean_ms": round(timed(driver, f"await openHead({last_layer}, null);")),
            "hover_ms": round(timed(driver, f"hover({len(summary['tokens']) // 2});"), 1),
        }
        if args.screenshot is not None:
            args.hover %= len(summary["tokens"])
            layer, head, _ = summary["ranking"]["induction"][0]  # the likeliest induction head, open
            timed(driver, f"await openHead({layer}, {head}); hover({args.hover}); window.scrollTo(0, 0);")
            args.screenshot.write_bytes(driver.get_screenshot_as_png())
            result["screenshot"] = str(args.screenshot)
        print(json.dumps(result))
    finally:
        driver.quit()
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
