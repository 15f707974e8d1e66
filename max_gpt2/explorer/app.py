"""The head explorer's HTTP side: the page, and the JSON it asks for, whatever serves it.

    app = ExplorerApp(lm)                                  # lm: a CompiledLM with its tokenizer
    status, content_type, body = app.handle("POST", "/api/explore", {}, b'{"text": "..."}')

Routes (under `prefix`, "" for `max-gpt2 explore`, "/explore" beside `max-gpt2 serve`'s API):

    GET  /                 the page (`page.html`, the explorer's script and styles inlined)
    POST /api/explore      {"text", "new_tokens", "temperature", "top_k", "top_p", "seed"} -> the
                           exploration's summary (`Exploration.summary`) and its "id"; with
                           new_tokens > 0 the text is continued first (greedy, or sampled
                           where temperature > 0) and the whole of it explored;
                           {"example": "induction"}: a random run of tokens, repeated
    GET  /api/map          ?id=&layer=&head= (no head: the layer's mean) -> one full map

Bad input (empty text, too long for `n_positions`, an option out of range, an unknown id) is a
400 with {"error": message}; anything else that goes wrong is a 500 with its message: the
server keeps serving. Explorations are kept for their maps, the last `KEPT`; the model runs one
request at a time.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from typing import Any
from urllib.parse import parse_qs

import numpy as np

from max_gpt2.analysis.head_scores import repeated_random_tokens
from max_gpt2.explorer.data import Exploration, explore
from max_gpt2.explorer.page import page
from max_gpt2.inference.lm import CompiledLM
from max_gpt2.inference.loading import LoadProgress, load_lm, step
from max_gpt2.inference.prompts import check_prompt
from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.tokenizer import END_OF_TEXT

KEPT = 8
EXAMPLE = 24  # random tokens in the induction example, before their repeat
Response = tuple[int, str, bytes]
JSON = "application/json"


class BadRequest(ValueError):
    """Input the explorer cannot take, said to the page as a 400."""


class ExplorerApp:
    """The explorer for one loaded model (its tokenizer, if it has one, reads the text)."""

    def __init__(self, lm: CompiledLM, prefix: str = "") -> None:
        self.lm, self.prefix = lm, prefix
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, Exploration] = OrderedDict()
        self._ids = itertools.count(1)

    @classmethod
    def load(
        cls,
        checkpoint: str,
        device: str = "auto",
        dtype: str = "float32",
        weight_format: str | None = None,
        progress: LoadProgress | None = None,
        prefix: str = "",
    ) -> ExplorerApp:
        """The explorer of a checkpoint `load_lm` reads, in any weight format: the attention-weights
        graph compiled, and the graphs that continue a text (kept compiled after the first time)."""
        lm = load_lm(
            checkpoint, device, dtype, weight_format=weight_format, output_attentions=True, progress=progress
        )
        graphs = lm.graph
        what = "compiling GPT-2's generation graphs, for continuations"
        with step(progress, what):
            graphs.compile(graphs.prompt_variant, graphs.step_variant)
        return cls(lm, prefix)

    def handle(self, method: str, path: str, query: str, body: bytes) -> Response:
        """The response to one request: (status, content type, body)."""
        route = path.removeprefix(self.prefix) or "/"
        try:
            if method == "GET" and route == "/":
                html = page(api=self.prefix, text_input=self.lm.tokenizer is not None)
                return 200, "text/html; charset=utf-8", html.encode()
            if method == "POST" and route == "/api/explore":
                return 200, JSON, json.dumps(self.explore(_body(body))).encode()
            if method == "GET" and route == "/api/map":
                return 200, JSON, json.dumps(self.head_map(parse_qs(query))).encode()
            return error_response(404, f"no route {method} {path}")
        except (BadRequest, ValueError) as error:
            return error_response(400, str(error))
        except Exception as error:  # the page says what happened; the server keeps serving
            return error_response(500, f"{type(error).__name__}: {error}")

    def explore(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("example") == "induction":
            tokens = self.induction_example()
        else:
            tokens = self.tokens(request.get("text"))
        new = request.get("new_tokens", 0)
        if isinstance(new, bool) or not isinstance(new, int) or new < 0:
            raise BadRequest(f"new_tokens must be a whole number, 0 or more; got {new!r}")
        with self._lock:
            if new:
                tokens = self.lm.generate(tokens[None], new, sampler=sampler(request))[0]
            exploration = explore(self.lm, tokens, self.lm.tokenizer)
            key = str(next(self._ids))
            self._kept[key] = exploration
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return {"id": key, "text": self.text(exploration.tokens), **exploration.summary()}

    def text(self, tokens: np.ndarray) -> str:
        """What the text box shows for `tokens`: their text, or their ids without a tokenizer."""
        tokenizer = self.lm.tokenizer
        if tokenizer is None:
            return ", ".join(str(int(token)) for token in tokens)
        return tokenizer.decode([int(token) for token in tokens], skip_special_tokens=False)

    def tokens(self, text: Any) -> np.ndarray:
        """The text's token ids, checked against the model; without a tokenizer, ids as "464, 3290"."""
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("the text is empty: type or paste some")
        tokenizer = self.lm.tokenizer
        if tokenizer is not None:
            ids = tokenizer.encode(text).ids
        else:
            try:
                ids = [int(part) for part in text.replace(",", " ").split()]
            except ValueError:
                raise BadRequest(
                    "this checkpoint has no tokenizer: give token ids, such as 464, 3290"
                ) from None
        checked, _ = check_prompt(self.lm.config, np.array([ids], dtype=np.int64))
        return checked[0]

    def induction_example(self) -> np.ndarray:
        """`EXAMPLE` random tokens, then the same again (`head_scores.repeated_random_tokens`), never the
        end of text."""
        config = self.lm.config
        length = min(EXAMPLE, config.n_positions // 2)
        tokenizer = self.lm.tokenizer
        ends = [*config.stop_token_ids, *([tokenizer.token_to_id(END_OF_TEXT)] if tokenizer else [])]
        stop = next((token for token in ends if token is not None), None)
        return repeated_random_tokens(config.vocab_size, length, seed=0, avoid=stop)

    def head_map(self, query: dict[str, list[str]]) -> dict[str, Any]:
        try:
            exploration = self._kept[query["id"][0]]
            layer = int(query["layer"][0])
            head = int(query["head"][0]) if query.get("head", [""])[0] != "" else None
        except (KeyError, ValueError):
            raise BadRequest("a map is asked for by id, layer and head, of an exploration kept") from None
        return exploration.head_map(layer, head)


def sampler(request: dict[str, Any]) -> Sampler:
    """The continuation's sampler: greedy at temperature 0 (the default), else sampled."""
    temperature = request.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise BadRequest(f"temperature must be a number, 0 or more; got {temperature!r}")
    if temperature == 0:
        return Sampler()
    options = {name: request.get(name) for name in ("top_k", "top_p", "seed")}
    return Sampler(do_sample=True, temperature=float(temperature), **options)


def _body(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body or b"{}")
    except json.JSONDecodeError as error:
        raise BadRequest(f"the request is not JSON: {error}") from None
    if not isinstance(request, dict):
        raise BadRequest("the request is a JSON object")
    return request


def error_response(status: int, message: str) -> Response:
    return status, JSON, json.dumps({"error": message}).encode()
