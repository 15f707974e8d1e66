"""llama-server's slots, as its clients read them: `GET /slots` and `POST /slots/{id}`.

llama-server decodes up to `--parallel` requests together, each in a slot of its own, and defers the
rest; MAX's scheduler decodes up to its batch (`/props`' `total_slots`: `--max-batch-size`, 16 on a
CPU) and queues the rest, first come, first served. `Slots` seats each request so: in the order they
come, in the lowest free slot, a request that finds none waiting for the next to free (where MAX plans
its batch itself, on a GPU, every request finds one). A slot shows the request it holds, or the last
it held, as llama-server shows it: its task's number, the tokens its cache holds, what it samples with
in llama-server's names, and while it runs, its prompt's tokens (those MAX's prefix cache gave too) and
the tokens made and left. `GET /slots?fail_on_no_slot=1` is a 503
where no slot is free, as llama-server answers it.

`POST /slots/{id}?action=save|restore|erase` (a slot's prompt cache to a file and back) is answered as
a llama-server started without `--slot-save-path` answers it, 501: MAX's prefix cache keeps pages by
their tokens for every request, not a slot's, and has no file form.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

from max.pipelines.context.sampling_params import SamplingParamsInput
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.choices import Choice
from max_gpt2.serving.api.protocol import Refusal, not_supported, refusal_response
from max_gpt2.serving.api.served import Served

UNSEEDED = 2**32 - 1  # the seed llama-server shows for a request that asked for none (drawn at random)
# llama-server's chain steps, by the names its params give them
CHAIN_NAMES = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typ_p": "typical_p",
}


@dataclass(frozen=True)
class Seated:
    """A slot's request: its task's number, its choice, and the sampling values it asked for."""

    task: int
    choice: Choice
    asked: SamplingParamsInput


class Slots:
    """Each slot's request (running, or the last it ran), and the requests waiting for a slot, in the
    order they came. A request leaves its slot when it ends (`Choice.done`)."""

    def __init__(self) -> None:
        self.held: list[Seated] = []
        self.waiting: deque[tuple[Choice, SamplingParamsInput]] = deque()
        self.tasks = itertools.count()

    def enter(self, choice: Choice, asked: SamplingParamsInput, total: int | None) -> None:
        """Seats `choice` (`asked`: what it asked to sample with) once a slot of `total` (None: as many as
        are asked for) is free."""
        self.waiting.append((choice, asked))
        self.seat(total)

    def seat(self, total: int | None) -> None:
        """Seats the requests waiting, first come first, while a slot is free."""
        while self.waiting:
            free = next((slot for slot, held in enumerate(self.held) if held.choice.done), None)
            if free is None and total is not None and len(self.held) >= total:
                return
            seated = Seated(next(self.tasks), *self.waiting.popleft())  # even if it has ended since
            if free is None:
                self.held.append(seated)
            else:
                self.held[free] = seated

    def states(self, total: int | None, context_length: int, speculative: bool) -> list[dict[str, Any]]:
        """Each slot's state in llama-server's shape (`GET /slots`), its requests seated first."""
        self.seat(total)
        count = max(total or 0, len(self.held), 1)
        shown = [
            {"id": slot, "n_ctx": context_length, "speculative": speculative, "is_processing": False}
            for slot in range(count)
        ]
        for state, seated in zip(shown, self.held, strict=False):
            state |= {"is_processing": not seated.choice.done, **task_state(seated)}
        return shown


def task_state(seated: Seated) -> dict[str, Any]:
    """What a slot shows of the request it holds or held, as llama-server's: the tokens its cache holds
    (the prompt and those made, but the last), and while it runs, the prompt's tokens computed and read
    from the prefix cache, and its progress; once it ends, those as llama-server leaves a slot it frees."""
    choice = seated.choice
    prompt, running, limit = (
        len(choice.prompt),
        not choice.done,
        choice.request.sampling_params.max_new_tokens,
    )
    return {
        "id_task": seated.task,
        "n_prompt_tokens": prompt + max(choice.made - 1, 0),
        "n_prompt_tokens_processed": prompt - choice.cached if running else 0,
        "n_prompt_tokens_cache": choice.cached if running else 0,
        "params": sampled_with(choice, seated.asked),
        "next_token": [
            {
                "has_next_token": running,
                "has_new_line": running and choice.new_line,
                "n_remain": limit - choice.made if running and limit is not None else -1,
                "n_decoded": choice.made if running else 0,
            }
        ],
    }


def sampled_with(choice: Choice, asked: SamplingParamsInput) -> dict[str, Any]:
    """What `choice` samples with, in llama-server's names: the cuts it `asked` for, else MAX's sampler's
    (at temperature 0 and none asked, `top_k` 1: the likeliest alone), its seed (`UNSEEDED` where it
    asked for none, as llama-server shows it), or where llama-server's chain runs on the host in MAX's
    sampler's place, the chain's values (the `GPT2Request`'s)."""
    params, request = choice.request.sampling_params, choice.request
    limit = -1 if params.max_new_tokens is None else params.max_new_tokens
    top_k, top_p, min_p = (
        given if (given := getattr(asked, name)) is not None else getattr(params, name)
        for name in ("top_k", "top_p", "min_p")
    )
    values: dict[str, Any] = {
        "seed": UNSEEDED if asked.seed is None else params.seed,  # choice i: the seed asked + i
        "temperature": params.temperature,
        "top_k": max(top_k, 0),  # llama-server's 0: no cut
        "top_p": top_p,
        "min_p": min_p,
        "typical_p": 1.0,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "max_tokens": limit,
        "n_predict": limit,
        "ignore_eos": params.ignore_eos,
        "n_probs": request.logprobs,
    }
    for step in getattr(request, "chain", None) or ():
        if (name := CHAIN_NAMES.get(str(step[0]))) is not None:
            values[name] = int(step[1]) if name == "top_k" else float(step[1])
    return values


async def list_slots(request: Request) -> Response:
    """llama-server's `GET /slots`; with `fail_on_no_slot`, a 503 where every slot is busy."""
    served = Served.of(request)
    states = served.slots.states(served.total_slots, served.context_length, served.settings.prompt_lookup > 0)
    if request.query_params.get("fail_on_no_slot") and all(state["is_processing"] for state in states):
        refusal = Refusal(None, "no slot available", 503, extra={"type": "unavailable_error", "code": 503})
        return refusal_response(refusal)
    return JSONResponse(states)


async def act_on_slot(request: Request) -> Response:
    """llama-server's `POST /slots/{id}?action=...`, as a llama-server without `--slot-save-path` answers."""
    return not_supported(
        "slots' actions are not served: MAX's prefix cache keeps prompts' pages by their tokens for every "
        "request, not a slot's prompt to save, restore or erase (llama-server answers so where started "
        "without --slot-save-path)"
    )
