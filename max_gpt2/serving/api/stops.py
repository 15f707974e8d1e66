"""A choice's text cut before its first stop string, token by token, as OpenAI and vLLM cut it.

    cut = StopCut(["\\n\\n", "The End"])
    shown = cut.add(" The")   # what a client may see now: "" while " The" could begin "The End"
    shown = cut.add(" cat")   # " The cat"
    cut.matched               # the stop string that ended the text, or None
    rest = cut.flush()        # at the end without a match: what was held back

`add` takes each token's text in turn. A stop string counts once it ends in the text of a
token past the first `after` (`min_tokens`: vLLM checks no stop before then); the first one
to end ends the text, before it (OpenAI's `stop`) or, with `keep`, after it (vLLM's
`include_stop_str_in_output`). With `indent` (llama-server's `n_indent`), a line past the first
that starts with fewer spaces or tabs ends the text just before its first other character
(`short`). Text that could begin a stop string is held back until the
next token tells (`max_gpt2.inference.stop_strings.held_back`), so a client streaming the
text is never shown what a later match takes away. The library's `stop_strings` keep Hugging
Face's meaning instead (the match stays in the tokens): docs/generation.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from max_gpt2.inference.stop_strings import held_back


class StopCut:
    """One choice's text so far, what of it a client has been shown, and the stop string that ended it."""

    def __init__(self, stops: Sequence[str], keep: bool = False, after: int = 0, indent: int = 0) -> None:
        self.stops, self.keep, self.after, self.indent = tuple(stops), keep, after, indent
        self.text = ""  # every token's text so far, the match and what follows it included
        self.shown = 0  # characters of `text` handed out
        self.tokens = 0
        self.matched: str | None = None
        self.short = False  # a line indented less than `indent` ended the text
        self.line: int | None = None  # where the line to check for its indentation starts, once known
        self.seek = 0  # where to look for the newline that starts the next one

    def add(self, piece: str) -> str:
        """Takes the next token's text; returns what a client may be shown now, after what it was shown."""
        assert self.matched is None and not self.short, "the text has ended"
        before = len(self.text)
        self.text += piece
        self.tokens += 1
        cut = self._under_indented() if self.indent else None
        if self.stops and self.tokens > self.after:
            # Matches ending in this piece (earlier ones ended an earlier piece, or came before `after`).
            ends = [
                (start + len(stop), start, stop)
                for stop in self.stops
                if (start := self.text.find(stop, max(0, before - len(stop) + 1))) >= 0
            ]
            if ends and (cut is None or min(ends)[1] <= cut):  # a stop string first, as llama-server
                end, start, self.matched = min(ends)
                return self._show(end if self.keep else start)
        if cut is not None:
            self.short = True
            return self._show(cut)
        # With `keep`, a match ends past the text so far, so nothing shown is ever taken back.
        held = 0 if self.keep else held_back(self.text, self.stops)
        return self._show(len(self.text) - held)

    def flush(self) -> str:
        """What is left to show once the choice has ended without a match."""
        return "" if self.matched is not None or self.short else self._show(len(self.text))

    def _under_indented(self) -> int | None:
        """Where the first line past the first whose spaces and tabs number fewer than `indent` has its
        first other character (a newline too, as llama-server counts it), or None."""
        while True:
            if self.line is None:  # the next line starts past the next newline
                if (newline := self.text.find("\n", self.seek)) < 0:
                    self.seek = len(self.text)
                    return None
                self.line = newline + 1
            line = self.text[self.line :]
            blank = len(line) - len(line.lstrip(" \t"))
            if blank == len(line):  # its first other character has not come yet
                return None
            if blank < self.indent:
                return self.line + blank
            self.seek, self.line = self.line + blank, None  # indented enough: on to the next line

    def _show(self, upto: int) -> str:
        new = self.text[self.shown : upto]
        self.shown = max(self.shown, upto)
        return new
