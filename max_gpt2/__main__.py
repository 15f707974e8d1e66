"""`python -m max_gpt2 demo|verify ...`; see `max_gpt2.cli`."""

from max_gpt2.cli import run

run()
