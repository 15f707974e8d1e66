"""The head explorer: every attention head of a GPT-2, and each token's probability, on a web page.

    data.py     what the page shows for one sequence (`explore`), and how it travels (bytes, base64)
    app.py      the HTTP side, whoever serves it: the page and its JSON routes (`ExplorerApp`)
    page.py     the page itself, one self-contained HTML file (static/: its markup, styles, script)
    server.py   `max-gpt2 explore`'s server; `max-gpt2 serve --explorer` mounts the app in its guard
    loading.py  the explorer's model, loaded in the background beside `max-gpt2 serve`'s API
    browser.py  headless Chromium through Selenium, for the explorer's browser tests and benchmark

docs/heads.md says how to read each view.
"""
