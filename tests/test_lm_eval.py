"""EleutherAI's lm-evaluation-harness, scoring through `max-gpt2 serve` and in-process with Hugging Face.

Two local tasks on the served checkpoint (LM's shapes, random weights): a
multiple-choice task (log-likelihood of each choice after the question) and a
perplexity task (`loglikelihood_rolling` over whole paragraphs, several windows
each). Through our server (`local-completions`, which reads `echo` and
`logprobs`) and through Hugging Face's model on the same files (`hf`), the
harness must find the same per-sample log-likelihoods, the same accuracy and the
same word perplexity. Skipped, saying why, without lm-eval (0.4.x), PyTorch and
transformers (optional peers) or MAX's serving extra.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from max_gpt2.testing import CORPUS
from tests.support import LM, run_python, serving_missing

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness 0.4 (pip install 'lm-eval[api,hf]<0.5')")
pytest.importorskip("torch", reason="the harness's in-process side needs torch (pip install -e '.[peers]')")
pytest.importorskip("transformers", reason="the harness's in-process side needs transformers")
pytest.importorskip(
    "accelerate", reason="the harness's hf model needs accelerate (pip install 'lm-eval[api,hf]<0.5')"
)
pytest.importorskip(
    "tenacity", reason="the harness's API models need tenacity (pip install 'lm-eval[api,hf]<0.5')"
)
if MISSING := serving_missing():
    pytest.skip(
        f"needs MAX's serving extra (pip install -e '.[serve]'); missing {MISSING}", allow_module_level=True
    )

QUESTIONS = [
    ("The cat sat on the", [" mat", " window", " number"], 0),
    ("Attention is all", [" you need", " the code", " of it"], 0),
    ("Every head of the model", [" looks back", " runs", " is a"], 1),
    ("def add(a, b):", [" return a + b", " pass", " print(a)"], 0),
    ("Numbers such as 14 and", [" 15", " words", " code"], 2),
]


def write_tasks(directory: Path) -> list[str]:
    """The two task YAMLs and their JSON-lines data in `directory`; returns the task names."""
    with (directory / "choices.jsonl").open("w") as data:
        for question, choices, answer in QUESTIONS:
            data.write(json.dumps({"question": question, "choices": choices, "answer": answer}) + "\n")
    paragraphs = [text for text in CORPUS.read_text(encoding="utf-8").split("\n\n") if text.strip()][:3]
    with (directory / "paragraphs.jsonl").open("w") as data:
        for paragraph in paragraphs:
            data.write(json.dumps({"text": paragraph}) + "\n")
    dataset = "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {}\n"
    (directory / "choices.yaml").write_text(
        "task: max_gpt2_choices\n"
        + dataset.format(directory / "choices.jsonl")
        + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    (directory / "paragraphs.yaml").write_text(
        "task: max_gpt2_paragraphs\n"
        + dataset.format(directory / "paragraphs.jsonl")
        + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n"
    )
    return ["max_gpt2_choices", "max_gpt2_paragraphs"]


def evaluate(model: str, model_args: str, tasks: list[str], directory: Path) -> dict:
    """The harness's command line, as a user runs it: its results, with every sample's responses."""
    output = directory / model
    done = run_python(
        "-m", "lm_eval", "run", "--model", model, "--model_args", model_args, "--tasks", *tasks,
        "--include_path", directory, "--batch_size", "1", "--log_samples", "--output_path", output,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = output.rglob("results_*.json")
    results = json.loads(results_file.read_text())
    results["samples"] = {
        task: [json.loads(line) for line in next(output.rglob(f"samples_{task}_*.jsonl")).open()]
        for task in tasks
    }
    return results


def loglikelihoods(results: dict, task: str) -> list[float]:
    """Every request's log-likelihood, sample by sample (a choice each, or a whole paragraph)."""
    samples = sorted(results["samples"][task], key=lambda sample: sample["doc_id"])
    responses = [response for sample in samples for response in sample["filtered_resps"]]
    # A choice's response is (log-likelihood, is greedy); a rolling one the log-likelihood alone.
    return [float(response[0] if isinstance(response, list) else response) for response in responses]


def test_the_harness_scores_alike_through_our_server_and_hugging_face(served_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    tasks = write_tasks(tmp_path)
    checkpoint, window = served_lm.checkpoint, LM.n_positions
    served = evaluate(
        "local-completions",
        f"model=gpt2,base_url={served_lm.url}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={checkpoint},max_length={window},num_concurrent=1,max_retries=1",
        tasks,
        tmp_path,
    )
    # The harness's API model keeps a position for the token it asks the server to generate and
    # rolls windows of max_length - 2 tokens; the same windows in-process need max_length - 2 there.
    in_process = evaluate(
        "hf", f"pretrained={checkpoint},dtype=float32,max_length={window - 2}", tasks, tmp_path
    )
    for task in tasks:
        ours, theirs = loglikelihoods(served, task), loglikelihoods(in_process, task)
        assert len(ours) == len(theirs) > 0
        assert ours == pytest.approx(theirs, abs=2e-3), task
    choices, paragraphs = (served["results"][task] for task in tasks)
    assert choices["acc,none"] == in_process["results"][tasks[0]]["acc,none"]
    assert 0 < choices["acc,none"] < 1  # random weights: neither the old certainty (1.0) nor nothing
    word_perplexity = in_process["results"][tasks[1]]["word_perplexity,none"]
    assert paragraphs["word_perplexity,none"] == pytest.approx(word_perplexity, rel=1e-3)
    assert paragraphs["word_perplexity,none"] > 10  # not the 1.0 a server without log-probabilities gives
