"""MAX's private API: every use of it in max-gpt2, here and nowhere else, each with why we need it.

MAX 26.7 gives no public way to do these few things, so the server (and constrained decoding,
on MAX's bundled grammar engine) leans on names MAX may rename in any release. Listing them in
one place means an upgrade is checked in one place: `tests/test_max_internals.py` looks each one
up in the installed MAX and fails naming what went missing, and that no other module names MAX's
private API. Where 26.7 has a public way, the code takes it instead: the pipeline's `kv_manager`
and `session.devices`, the pipeline model's `arch_config_as` and its batch processor's
`get_symbolic_inputs`, `Tensor.graph_values` for the KV cache's graph inputs, and the `max`
command's console-script entry point.

- `HOOKS`: private methods of MAX's classes that a subclass of ours overrides,
  calling MAX's own through `super()`, as MAX's architectures override theirs
  (its `llama3_modulev3` overrides two, `_create_model_config` and
  `_instantiate_module`, the hooks MAX's `load_model` leaves to an architecture).
- `CALLS`: private functions and module attributes, reached only through the
  functions below.

One more is Mojo's, in a kernel, and cannot move here: `CompilationTarget._has_feature["avx512bf16"]`
(`max_gpt2/kernels/bfloat16_products.mojo`) asks whether the CPU has `vdpbf16ps`; every compile of
the bfloat16 kernels checks that it is still there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from max.pipelines.lib import MAXModelConfig
    from max.pipelines.modeling.config_enums import SupportedEncoding


@dataclass(frozen=True)
class PrivateName:
    """One name of MAX's private API that max-gpt2 relies on: the module it is found in, the name
    there (`Class._method` for a method), and why we need it."""

    module: str
    name: str
    why: str

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"


HOOKS = (
    PrivateName(
        "max.pipelines.lib",
        "TextGenerationPipeline._execute",
        "a scheduler step: all-greedy host steps take the argmax and decode several tokens; `execute` "
        "runs it inside MAX's request validator, which our steps keep (max_gpt2.serving.pipeline)",
    ),
    PrivateName(
        "max.pipelines.lib",
        "TextGenerationPipeline._launch_forward_pass",
        "the one place between the model's logits and MAX's sampler that sees the requests: penalties "
        "and min_tokens edit the logits there (max_gpt2.serving.pipeline)",
    ),
)
CALLS = (
    PrivateName(
        "max.serve._error_envelope",
        "openai_error_body",
        "the error body MAX's own responses carry (OpenAI's, its type by status): the guard's refusals "
        "read the same (`error_body`)",
    ),
    PrivateName(
        "max.serve.router._disconnect",
        "ClientDisconnected",
        "what a route raises when its client hangs up before the answer: MAX's request middleware then "
        "answers 499, logs it in one line and counts it as such; a 499 the route returns itself reaches "
        "that middleware as no response, an ERROR traceback and a 500 in its metrics (`client_left`)",
    ),
    PrivateName(
        "max.pipelines.lib.config.model_config",
        "_select_quantization_encoding",
        "the encoding MAX serves with (--quantization-encoding, else the checkpoint's, else ours): 26.7's "
        "config holds only the user's value, and MAX's own architectures resolve it so (`served_encoding`)",
    ),
    PrivateName(
        "max._entrypoints.cli.serve.serve_api_and_model_worker",
        "fastapi_app",
        "`max serve` builds its HTTP app with it, and 26.7 has no option for middleware or routes of "
        "one's own: wrapped to mount our front end (`run_max_serve`)",
    ),
    PrivateName(
        "max.serve.telemetry.process_controller",
        "init_and_process",
        "what MAX's metrics process runs: it serves the metrics on a TCP port of their own (8001 unless "
        "told), which a second server on the host cannot bind; replaced by `metrics_process` "
        "(`max_gpt2.serving.api.metrics`), which serves them on a Unix socket our /metrics reads "
        "(`use_metrics_socket`)",
    ),
    PrivateName(
        "max.serve.telemetry.process_controller",
        "process_telemetry",
        "the metrics process's loop, which `metrics_process` runs as MAX's own does",
    ),
    PrivateName(
        "max._xgrammar",
        "GrammarCompiler",
        "MAX's bundled grammar engine (xgrammar), which its own structured output runs on, compiles "
        "each constraint of constrained decoding (`grammar_compiler`)",
    ),
    PrivateName("max._xgrammar", "TokenizerInfo", "the engine's view of a vocabulary (`grammar_compiler`)"),
    PrivateName("max._xgrammar", "GrammarMatcher", "a constrained row's state (`grammar_matcher`)"),
    PrivateName("max._xgrammar", "get_bitmask_size", "the allowed tokens' bitmask's width (`bitmask_words`)"),
    PrivateName(
        "max._core.xgrammar",
        "TokenizerInfo.detect_metadata_from_hf",
        "a vocabulary's type and prefix space, read from the tokenizer's JSON as the engine's "
        "`from_huggingface` reads them, which needs a `transformers` tokenizer (`grammar_compiler`)",
    ),
    PrivateName("max._core.xgrammar", "VocabType", "the vocabulary's type by its code (`grammar_compiler`)"),
)
PRIVATE_API = HOOKS + CALLS


def error_body(status: int, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error body as MAX's own error responses carry it, `param` naming the field."""
    from max.serve._error_envelope import openai_error_body  # CALLS: MAX's responses have this shape

    body = openai_error_body(status, message)
    body["error"]["param"] = param
    return body


def client_left() -> Exception:
    """What a route raises when its client hangs up before the answer starts: MAX's request middleware
    answers 499 for it, as for MAX's own routes."""
    from max.serve.router._disconnect import ClientDisconnected  # CALLS: the middleware's own signal

    return ClientDisconnected()


def served_encoding(model_config: MAXModelConfig, default: SupportedEncoding) -> SupportedEncoding:
    """The encoding MAX serves `model_config` with, `default` where neither the command line nor the
    checkpoint says."""
    from max.pipelines.lib.config.model_config import (  # CALLS: no public way to resolve it in 26.7
        _select_quantization_encoding,
    )

    return _select_quantization_encoding(model_config, default)


def run_max_serve(on_app: Callable[[Any], None]) -> None:
    """Runs MAX's `max` command on this process's arguments (`max serve ...`), calling `on_app` with
    its HTTP app (a FastAPI app) before it serves."""
    from max._entrypoints.cli.serve import (  # CALLS: the app is built here, and only here
        serve_api_and_model_worker as entry,
    )

    build_app = entry.fastapi_app

    def hooked_app(*args: Any, **kwargs: Any) -> Any:
        app = build_app(*args, **kwargs)
        on_app(app)
        return app

    entry.fastapi_app = hooked_app
    max_command()()


def use_metrics_socket(process: Callable[..., None]) -> None:
    """Has MAX's metrics process, once started, run `process` (with `init_and_process`'s arguments:
    settings, queue, alive, commit) in place of MAX's own, which serves the metrics on a port."""
    from max.serve.telemetry import process_controller  # CALLS: the metrics process's function

    process_controller.init_and_process = process


def process_telemetry(metrics_queue: Any, alive: Any, commit: Any) -> None:
    """MAX's metrics process's loop, as MAX's own `init_and_process` runs it."""
    from max.serve.telemetry.process_controller import process_telemetry as loop  # CALLS: MAX's loop

    loop(metrics_queue, alive, commit)


def grammar_compiler(tokenizer_json: str, pieces: list[str], stop_ids: list[int], special: list[int]) -> Any:
    """MAX's grammar engine's compiler for one vocabulary: `pieces` the tokens' strings by id (the
    model's vocabulary), `tokenizer_json` the tokenizer's own JSON (`tokenizers.Tokenizer.to_str`),
    `stop_ids` what ends a complete text, `special` ids that are never text."""
    import json

    from max import _xgrammar as xgrammar  # CALLS: MAX's grammar engine
    from max._core.xgrammar import TokenizerInfo, VocabType  # CALLS: the vocabulary's metadata

    metadata = json.loads(TokenizerInfo.detect_metadata_from_hf(tokenizer_json))
    info = xgrammar.TokenizerInfo(
        pieces,
        VocabType(metadata["vocab_type"]),
        len(pieces),
        stop_token_ids=stop_ids,
        add_prefix_space=metadata["add_prefix_space"],
        special_token_ids=special,
    )
    return xgrammar.GrammarCompiler(info, max_threads=1)


def grammar_matcher(compiled: Any, stop_ids: list[int]) -> Any:
    """A matcher of one compiled grammar: which tokens may come next, and the state the chosen advance."""
    from max._xgrammar import GrammarMatcher  # CALLS: MAX's grammar engine

    return GrammarMatcher(compiled, override_stop_tokens=stop_ids)


def bitmask_words(vocab_size: int) -> int:
    """The int32 words a row of the engine's allowed-token bitmask takes for `vocab_size` tokens."""
    from max._xgrammar import get_bitmask_size  # CALLS: MAX's grammar engine

    return get_bitmask_size(vocab_size)


def max_command() -> Callable[[], Any]:
    """The function MAX's `max` command runs, found through MAX's console-script entry point."""
    from importlib.metadata import entry_points  # here: its import is 30 ms of every start-up

    (command,) = entry_points(group="console_scripts", name="max")
    return command.load()
