# `make demo` and `make test` are all a newcomer needs: both build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo verify test test-gpu gpu-proof bench bench-generate serve lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m max_gpt2 demo

verify: $(STAMP)
	$(PY) -m max_gpt2 verify --json

# MAX_GPT2_PREWARM: a second process compiles the suite's graphs from the last (tests/prewarm.py).
test: $(STAMP)
	MAX_GPT2_PREWARM=1 $(PY) -m pytest

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -rs

# The accelerator proven in one lease (benchmarks/gpu_proof, docs/gpu.md): results in GPU_PROOF_OUT as
# they come. On a machine without .venv (a lent GPU machine) pass PY=python3; GPU_PROOF_ARGS adds options
# (--precompiled DIR, --budget SECONDS, --dry-run).
GPU_PROOF_OUT ?= gpu-proof
GPU_PROOF_ARGS ?=
gpu-proof: $(if $(filter $(VENV)/%,$(PY)),$(STAMP))
	$(PY) benchmarks/gpu_proof --out $(GPU_PROOF_OUT) $(GPU_PROOF_ARGS)

# Side-by-side timings (benchmarks/README.md). PyTorch joins in when installed; pass options
# through BENCH_ARGS, e.g. make bench BENCH_ARGS="--models small --shapes 1x128 --no-cold-compile".
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,plot]'
	$(PY) -m max_gpt2 bench $(BENCH_ARGS)

# Generation, ours against Hugging Face (when PyTorch and transformers are installed), e.g.
# make bench-generate BENCH_ARGS="--models small --rounds 5".
bench-generate: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,plot]'
	$(PY) -m max_gpt2 bench-generate $(BENCH_ARGS)

# Our GPT-2 behind MAX's OpenAI-compatible server, e.g. make serve SERVE_ARGS="--checkpoint ~/models/gpt2".
SERVE_ARGS ?=
serve: $(STAMP)
	$(PY) -m max_gpt2 serve $(SERVE_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
