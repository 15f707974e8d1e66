"""The server's stop strings (`max_gpt2.serving.api.stops.StopCut`) against a reference written here.

The reference reads the whole text at once: the first stop string to end, among those that end
in the text of a token past the first `min_tokens`, ends the text (before it, or after it with
`keep`); the token whose text completed it is the last one kept. `StopCut` sees one token at a
time and streams: what it shows, joined, must be the reference's text, and no prefix it shows
may be taken back (each is a prefix of the final text). llama-server's `n_indent` likewise: the
reference cuts the whole text at the first line past the first indented less. No server, no graph.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2.serving.api.stops import StopCut


def reference(pieces: list[str], stops: list[str], keep: bool, after: int) -> tuple[str, int, str | None]:
    """The text a client gets, how many tokens are kept, and the stop string matched (or None)."""
    text = "".join(pieces)
    ends = [sum(map(len, pieces[: i + 1])) for i in range(len(pieces))]  # where each token's text ends
    found = []
    for stop in stops:
        start = text.find(stop)
        while start >= 0:
            end = start + len(stop)
            token = next(i for i, token_end in enumerate(ends) if token_end >= end)
            if token >= after:  # the (after + 1)-th token or later completed it
                found.append((token, end, start, stop))
                break
            start = text.find(stop, start + 1)
    if not found:
        return text, len(pieces), None
    token, end, start, stop = min(found)
    return text[: end if keep else start], token + 1, stop


def streamed(
    pieces: list[str], stops: list[str], keep: bool, after: int
) -> tuple[list[str], int, str | None]:
    cut = StopCut(stops, keep, after)
    shown, kept = [], 0
    for piece in pieces:
        shown.append(cut.add(piece))
        kept += 1
        if cut.matched is not None:
            break
    shown.append(cut.flush())
    return shown, kept, cut.matched


LETTERS = st.text(alphabet="abc ", max_size=4)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(LETTERS, max_size=12),
    stops=st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), min_size=1, max_size=3),
    keep=st.booleans(),
    after=st.integers(0, 3),
)
def test_stop_cut_gives_the_references_text_and_never_takes_back_what_it_showed(pieces, stops, keep, after):
    shown, kept, matched = streamed(pieces, stops, keep, after)
    text, wanted_kept, wanted_match = reference(pieces, stops, keep, after)
    assert "".join(shown) == text
    assert (kept, matched) == (wanted_kept, wanted_match)
    so_far = ""
    for part in shown:
        so_far += part
        assert text.startswith(so_far)


def test_a_match_can_start_the_text_fall_inside_a_token_or_span_tokens():
    assert streamed(["jet", "jet"], ["jet"], False, 0) == (["", ""], 1, "jet")  # OpenAI's "" for "jetjet"
    assert streamed([" te", "ch"], ["ch"], False, 0) == ([" te", "", ""], 2, "ch")
    assert streamed(["abc", "def"], ["cd"], False, 0) == (["ab", "", ""], 2, "cd")  # across two tokens
    assert streamed(["abc", "def"], ["cd"], True, 0) == (["abc", "d", ""], 2, "cd")  # with the match
    assert streamed(["abc", "def"], ["b"], False, 1) == (["abc", "def", ""], 2, None)  # before min_tokens


def test_text_that_could_begin_a_stop_string_waits_for_the_next_token():
    cut = StopCut(["The End"])
    assert cut.add("Once. The") == "Once. "
    assert cut.add(" cat") == "The cat"
    assert cut.add(". The En") == ". "
    assert cut.add("d.") == "" and cut.matched == "The End"


def indented_reference(text: str, indent: int) -> tuple[str, bool]:
    """The text up to the first character, past its first line, that is not a space or tab and starts a
    line less indented than `indent` (a newline starting an empty one too), and whether one did."""
    starts = [position + 1 for position, character in enumerate(text) if character == "\n"]
    for start in starts:
        blank = 0
        while start + blank < len(text) and text[start + blank] in " \t":
            blank += 1
        if start + blank < len(text) and blank < indent:
            return text[: start + blank], True
    return text, False


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text(alphabet="ab \t\n", max_size=4), max_size=12), indent=st.integers(1, 3))
def test_indent_cuts_the_references_text_at_the_first_line_indented_less(pieces, indent):
    cut, shown = StopCut([], indent=indent), []
    for piece in pieces:
        shown.append(cut.add(piece))
        if cut.short:
            break
    shown.append(cut.flush())
    text, short = indented_reference("".join(pieces), indent)
    assert ("".join(shown), cut.short) == (text, short)
    so_far = ""
    for part in shown:
        so_far += part
        assert text.startswith(so_far)
