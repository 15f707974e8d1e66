"""llama-server's token pickers on its `POST /completion`, through the real server: Mirostat (the first,
and 2.0: the temperature, then Mirostat alone, as llama.cpp's chain has it) and adaptive-p (after the
chain, where `samplers` names it). The tokens each must give come from the tests' own loops over the
served weights' logits through the references of `tests/test_sampler_chain.py`, each token's draw the
seed's; where llama.cpp is built (`LLAMA_CPP`), llama-server's own Mirostat draws on the same weights
fall among the tokens ours keeps."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.inference.sampler_chain import LOWEST, chain
from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.support import requires_serving
from tests.test_sampler_chain import (
    adaptive_reference,
    mirostat_1_kept,
    mirostat_1_reference,
    mirostat_reference,
)
from tests.test_serve import PROMPTS
from tests.test_serve_native import post

pytestmark = requires_serving()


@pytest.mark.parametrize(
    ("version", "reference", "temperature"), [(2, mirostat_reference, 0.8), (1, mirostat_1_reference, 0.05)]
)
def test_mirostat_picks_each_token_as_llama_cpps_from_the_seeds_draws(
    served_lm, served_model, served_tokenizer, version, reference, temperature
):
    """Mirostat after the temperature, llama.cpp's whole chain then: the tokens are this test's loop over
    the model's logits through `tests/test_sampler_chain`'s reference, mu from twice tau, the draw for a
    request's n-th token `np.random.default_rng([seed, n]).random()` (the first Mirostat at a low
    temperature, so that its estimate of k is above 1)."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    tau, eta, seed = 3.0, 0.5, 11
    ids, mu, not_argmax = list(prompt), 2 * tau, 0
    for n in range(8):
        row = served_model.logits(np.array([ids]))[0, -1]
        row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
        draw = float(np.random.default_rng([seed, n]).random())
        token, mu = reference(chain(row, [("temperature", temperature)]), tau, eta, mu, draw)
        ids.append(token)
        not_argmax += token != int(np.argmax(row))
    body = {"prompt": prompt, "n_predict": 8, "mirostat": version, "mirostat_tau": tau, "mirostat_eta": eta}
    body |= {"temperature": temperature, "seed": seed, "ignore_eos": True, "return_tokens": True}
    body |= {"repeat_penalty": 1.5, "top_k": 1}  # left out of llama.cpp's chain beside Mirostat
    status, answer = post(served_lm, "/completion", body)
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] and not_argmax > 0, answer


def test_llama_servers_mirostat_draws_what_ours_keeps(served_model, served_tokenizer, llama_server):
    """Mirostat 2.0's first token, whose mu is twice tau: tau is set midway in the widest gap between
    the five likeliest tokens' surprises (so that llama.cpp's logits, about 1e-3 from ours, keep the
    same ones), and llama-server's draws over 24 seeds are among them, more than one."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    ranked = np.sort(row[row > LOWEST].astype(np.float64))[::-1]
    surprise = -np.log2(np.exp(ranked - ranked[0]) / np.exp(ranked - ranked[0]).sum())
    widest = 1 + int(np.argmax(surprise[2:6] - surprise[1:5]))  # at least two kept
    tau = float(surprise[widest] + surprise[widest + 1]) / 4
    kept = set(np.argsort(-row)[: widest + 1].tolist())
    body = {"prompt": prompt, "n_predict": 1, "mirostat": 2, "mirostat_tau": tau, "temperature": 1.0}
    body |= {"ignore_eos": True, "return_tokens": True}
    drawn = {post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)}
    assert drawn <= kept and len(drawn) > 1, (drawn, kept)


def test_llama_servers_first_mirostat_draws_what_ours_keeps(served_model, served_tokenizer, llama_server):
    """The first Mirostat's first token (mu twice tau): llama-server's draws over 24 seeds fall among the
    k likeliest our estimate keeps (one more allowed: llama.cpp's logits are about 1e-3 from ours)."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    kept, _ = mirostat_1_kept(chain(row, [("temperature", 0.05)]), 6.0)
    allowed = set(np.argsort(-row)[: len(kept) + 1].tolist())
    body = {"prompt": prompt, "n_predict": 1, "mirostat": 1, "mirostat_tau": 3.0, "temperature": 0.05}
    body |= {"ignore_eos": True, "return_tokens": True}
    drawn = {post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)}
    assert drawn <= allowed and len(drawn) > 1, (drawn, kept)


def test_adaptive_p_picks_each_token_after_the_chain_as_llama_cpps(served_lm, served_model, served_tokenizer):
    """Adaptive-p, named in `samplers`, picks from what llama-server's chain keeps: this test's loop
    through the chain and `tests/test_sampler_chain`'s reference, its state from the target over one less
    the decay; without it in `samplers`, `adaptive_target` changes nothing, as in llama-server."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    steps = [("top_k", 40), ("top_p", 0.95), ("min_p", 0.05), ("temperature", 0.1)]
    target, decay, seed = 0.3, 0.8, 4
    ids, state, not_argmax = list(prompt), (target / (1 - decay), 1 / (1 - decay)), 0
    for n in range(8):
        row = served_model.logits(np.array([ids]))[0, -1]
        row[eos] = LOWEST
        draw = float(np.random.default_rng([seed, n]).random())
        token, state = adaptive_reference(chain(row, steps), target, decay, state, draw)
        ids.append(token)
        not_argmax += token != int(np.argmax(row))
    body = {"prompt": prompt, "n_predict": 8, "adaptive_target": target, "adaptive_decay": decay}
    body |= {"temperature": 0.1, "seed": seed, "ignore_eos": True, "return_tokens": True}
    status, answer = post(served_lm, "/completion", {**body, "samplers": "kpmta"})
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] and not_argmax > 0, answer
    assert answer["generation_settings"]["samplers"][-1] == "adaptive_p"
    drawn = post(served_lm, "/completion", body)[1]["tokens"]  # no `samplers`: not in the chain
    off = post(served_lm, "/completion", {**body, "adaptive_target": -1})[1]["tokens"]
    assert drawn == off != answer["tokens"]
