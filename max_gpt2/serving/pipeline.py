"""MAX's text-generation pipeline: penalties applied on the host, greedy tokens picked without MAX's
sampler, several a step.

`max serve` runs one `TextGenerationPipeline.execute` per step: the batch's
inputs, the model's graph, then MAX's sampler, a second graph that takes
temperature, top-k, top-p, min-p and seeds for every request. Four things change here:

- Penalties, `logit_bias` and `min_tokens`: each request's next-token logits are
  edited before any token is picked (`max_gpt2.serving.logit_edits`): its controls, a
  constraint's mask, llama-server's sampler chain where it runs on the host (MAX then drawing
  at temperature 1) and its token picker; where a request reports what its token is drawn
  from (`post_sampling_probs`), the step's outputs carry it (`max_gpt2.serving.drawn_from`).
  MAX's own support for penalties is left off: in MAX 26.7 it cannot be built beside
  `--enable-echo`.
- Greedy steps: when every request of a step is greedy and asks for nothing the
  sampler alone gives (log-probabilities, a grammar, logits processors, label
  scores), its token is the argmax of its row of logits `[R, V]`, which NumPy finds
  in microseconds on a CPU, cheaper than the sampler's graph (docs/performance.md).
  Any other step, and every step on an accelerator, goes through MAX's `_execute`.
- Several tokens a scheduler step: such a step, when every request in it is
  decoding (one new token each, no prompt), goes on for up to `DECODE_STEPS`
  tokens (`ServingSettings.decode_steps`: `max-gpt2 serve --decode-steps`)
  before it returns to MAX's scheduler, as vLLM's multi-step scheduling did: MAX's
  own work between two graph runs (scheduler, batch, metrics, the response to the
  API process) is then paid once for several tokens (docs/performance.md). A step
  stops early when a request ends (end-of-text, its length), when the KV cache has
  no page for a next token, or when one more token would take it past
  `DECODE_BUDGET_S`: a new prompt waits for the step to end, so a step lasts about
  as long whether a token takes a few milliseconds or twenty.
- Drafts: with prompt lookup (`max-gpt2 serve --prompt-lookup K`), each run of such
  a step checks every request's drafted tokens with its last one and keeps what the
  model chooses (`max_gpt2.serving.drafts`), where no request of the step has its
  logits penalised or end-of-text banned, and while drafted runs of as many requests
  have made more tokens a second than runs without (`RunRates`); a constrained
  request's draft is cut where its constraint forbids it and each position masked
  (`max_gpt2.serving.constraints`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from max.driver import CPU, Buffer
from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs
from max.pipelines.context import TextContext, TextGenerationOutput
from max.pipelines.context.sampling_params import SamplingParams
from max.pipelines.kv_cache import InsufficientBlocksError
from max.pipelines.lib import ModelInputs, ModelOutputs, TextGenerationPipeline
from max.pipelines.modeling.types import PipelineOutputsDict, TextGenerationInputs

from max_gpt2.inference.token_pickers import in_play
from max_gpt2.serving.constraints import ServedConstraints, constraint_of
from max_gpt2.serving.drafts import CheckedDrafts, ServedDrafts
from max_gpt2.serving.drawn_from import Among, DrawnOutputs
from max_gpt2.serving.logit_edits import edited, edits_logits, needs_controls, reports_drawn
from max_gpt2.serving.settings import ServingSettings

# Seconds one scheduler step may spend decoding: MAX's ~2 ms between scheduler steps stays a few
# per cent of it, and a prompt that arrives meanwhile waits no longer (docs/performance.md).
DECODE_BUDGET_S = 0.05


def greedy_as_is(params: SamplingParams) -> bool:
    """Whether MAX's sampler would pick the argmax of the logits (edited by `logit_edits` first) for a
    request with `params`."""
    return (
        params.top_k == 1  # temperature 0 sets it; top-p and min-p then keep the top token
        and params.logits_processors is None
    )


class _ControlsApplied(logging.Filter):
    """Drops MAX's warnings that penalties and min_tokens are ignored: this pipeline applies them
    (`max_gpt2.serving.logit_edits`), and MAX's own support is left off (MAX 26.7 cannot build its
    penalties into the sampler beside `--enable-echo`'s variable logits)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(("Penalties are provided in the request", "min_tokens is provided"))


def argmax_applies(context: TextContext) -> bool:
    """Whether `context`'s next token is the argmax of its logits, with nothing else asked of the step."""
    return (
        greedy_as_is(context.sampling_params)
        and not context.log_probabilities
        and context.json_schema is None
        and context.grammar is None
        and context.label_token_ids is None
    )


class GPT2TextGenerationPipeline(TextGenerationPipeline[TextContext]):
    """MAX's pipeline, with all-greedy steps on the host decided by NumPy's argmax, several a step.

    It overrides two of MAX's private hooks, `_execute` and `_launch_forward_pass`: they are listed, with
    why, in `max_gpt2.max_internals.HOOKS`, where a MAX upgrade that drops them is caught.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = ServingSettings.from_environment()
        self._decode_steps = settings.decode_steps
        self._on_host = all(device.is_host for device in self.session.devices)  # ours, and the host
        self._drafts = ServedDrafts(most) if (most := settings.prompt_lookup) else None
        self._constraints = ServedConstraints(lambda: self.tokenizer.grammars)
        logging.getLogger("max.pipelines").addFilter(_ControlsApplied())

    def _launch_forward_pass(
        self, curr_step_inputs: ModelInputs, flat_batch: list[TextContext], step: int
    ) -> ModelOutputs:
        """The model's outputs for a step, each request's next-token logits edited as it asks
        (`max_gpt2.serving.logit_edits`): MAX's sampler and our argmax both pick from those. Where a
        request reports what its token is drawn from, the outputs carry it (`DrawnOutputs`)."""
        outputs = super()._launch_forward_pass(curr_step_inputs, flat_batch, step)
        if isinstance(curr_step_inputs, CheckedDrafts) or not any(edits_logits(c) for c in flat_batch):
            return outputs  # a run of drafts is masked where its tokens are chosen (`_check_drafts`)
        last_rows = outputs.next_token_logits  # [R, V]: GPT2PipelineModel always gives them
        assert last_rows is not None
        rows = np.array(last_rows.to(CPU()).to_numpy())  # [R, V], ours to edit
        drawn: dict[int, Among] = {}  # row -> what its token is drawn from, where it reports it
        mask, dry_heads = self._constraints.mask, self.tokenizer.dry_heads
        for row, context in enumerate(flat_batch):
            rows[row], picked = edited(rows[row], context, mask, dry_heads)
            if reports_drawn(context):  # a picker's draw, or the softmax of what the row keeps
                drawn[row] = (picked.ids, picked.chances) if picked else in_play(rows[row])
        next_rows = Buffer.from_numpy(rows).to(last_rows.device)
        return DrawnOutputs.of(outputs, drawn, next_token_logits=next_rows)

    def _execute(
        self, inputs: TextGenerationInputs[TextContext]
    ) -> PipelineOutputsDict[TextGenerationOutput]:
        contexts = inputs.flat_batch
        if not (contexts and self._on_host and all(argmax_applies(context) for context in contexts)):
            return super()._execute(inputs)
        # Past its prompt, a request brings one token; a step with a prompt in it gives it its first now.
        decoding = all(c.tokens.generated_length and c.tokens.active_length == 1 for c in contexts)
        started = time.perf_counter()
        for step in range(self._decode_steps if decoding else 1):
            if step and not (
                within_budget(step, time.perf_counter() - started) and self._next_step_fits(contexts)
            ):
                break
            model_inputs, _, flat_batch = self.prepare_batch(inputs.batches)  # no grammar: no bitmask
            for context, tokens in zip(
                flat_batch, self._next_tokens(model_inputs, flat_batch, step, decoding), strict=True
            ):
                for token in tokens:
                    if context.is_done:
                        break
                    context.advance_token_buffer(new_token=token)  # ends the request at EOS or its length
                    context.advance_fsm(token)
            for context in contexts:
                self.kv_manager.step(context)
                if self._drafts and context.is_done:
                    self._drafts.finish(context)
        outputs_now = {context.request_id: context.to_generation_output() for context in contexts}
        return {request_id: output for request_id, output in outputs_now.items() if output.tokens}

    def _next_tokens(
        self, model_inputs: ModelInputs, contexts: list[TextContext], step: int, decoding: bool
    ) -> list[list[int]]:
        """The tokens each request gets from one run of the model: its argmax, and where it drafts, the
        drafted tokens the model chose too, each followed by the argmax after it."""
        started, drafts = time.perf_counter(), []  # a drafted run's time includes looking its drafts up
        if (
            self._drafts
            and decoding
            and not any(needs_controls(context) for context in contexts)
            and self._drafts.rates.drafting(len(contexts))
        ):
            drafts = [  # a constrained request's cut at its first token the constraint forbids
                self._constraints.allowed(context, draft) if len(draft) and constraint_of(context) else draft
                for context, draft in zip(contexts, self._drafts.propose(contexts), strict=True)
            ]
        if any(len(draft) for draft in drafts):
            tokens = self._check_drafts(model_inputs, contexts, drafts, step)
        else:
            outputs = self._launch_forward_pass(model_inputs, contexts, step=step)
            last_rows = outputs.next_token_logits  # [R, V]: GPT2PipelineModel always gives them
            assert last_rows is not None
            tokens = [[token] for token in np.argmax(last_rows.to_numpy(), axis=-1).tolist()]
        if self._drafts and decoding:
            drafted, made = any(len(draft) for draft in drafts), sum(len(kept) for kept in tokens)
            self._drafts.rates.ran(len(contexts), drafted, made, time.perf_counter() - started)
        return tokens

    def _check_drafts(
        self, model_inputs: ModelInputs, contexts: list[TextContext], drafts: list[np.ndarray], step: int
    ) -> list[list[int]]:
        """One run of each request's last token and its draft, padded to the longest draft
        (`max_gpt2.serving.drafts`); the tokens each keeps."""
        assert self._drafts is not None
        size = 1 + max(len(draft) for draft in drafts)  # S tokens a request
        rows = np.empty((len(contexts), size), dtype=np.int64)  # [R, S]
        for row, context, draft in zip(rows, contexts, drafts, strict=True):
            row[0], row[1 : 1 + len(draft)] = context.tokens.active[0], draft
            row[1 + len(draft) :] = row[len(draft)]  # padding, never kept
        assert isinstance(model_inputs, Llama3Inputs)  # MAX's batch processor's, the model's
        checked = CheckedDrafts(
            tokens=Buffer.from_numpy(rows.reshape(-1)),
            input_row_offsets=Buffer.from_numpy(np.arange(len(contexts) + 1, dtype=np.uint32) * size),
            return_n_logits=model_inputs.return_n_logits,
            kv_cache_inputs=model_inputs.kv_cache_inputs,
        )
        logits = self._launch_forward_pass(checked, contexts, step).logits.to_numpy()  # [R * S, V]
        runs = logits.reshape(len(contexts), size, -1)  # [R, S, V]
        chosen = np.stack(
            [
                np.argmax(self._constraints.mask_run(c, draft, run) if constraint_of(c) else run, axis=-1)
                for run, c, draft in zip(runs, contexts, drafts, strict=True)
            ]
        )
        return [self._drafts.keep(*each) for each in zip(contexts, drafts, chosen, strict=True)]

    def release(self, request_id: Any) -> None:
        """MAX's release of a request that ended or was cancelled, and our constraint's state for it."""
        super().release(request_id)
        self._constraints.release(request_id)

    def _next_step_fits(self, contexts: list[TextContext]) -> bool:
        """Whether every request goes on, with room in the KV cache for its next token (claimed here,
        as the scheduler would for the next step; a request that does not fit ends the step)."""
        if any(context.is_done for context in contexts):
            return False
        try:
            for context in contexts:
                self.kv_manager.alloc(context)
        except InsufficientBlocksError:
            return False
        return True


def within_budget(steps: int, elapsed: float) -> bool:
    """Whether one more step, as long as the `steps` so far took on average (`elapsed` seconds in
    all), ends within `DECODE_BUDGET_S`."""
    return elapsed * (steps + 1) / steps <= DECODE_BUDGET_S
