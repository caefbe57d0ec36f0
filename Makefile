# The two commands of the README: `make demo` and `make test`. Both install first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# Test processes (pytest-xdist). Most multi-process tests wait on sleeps, timeouts and peers: two
# workers keep a 2-core CI machine busy (1,619 s serial against 1,272 s, session 32). Each test
# starts up to ~10 processes of its own, so more workers than cores mostly adds load.
TEST_WORKERS ?= 2

.PHONY: install demo test lint protos protos-check bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: install
	$(BIN)/prism demo

lint: install
	$(BIN)/lint-imports
	@# Undefined names only (a NameError in an engine's thread hangs a rank until its timeout);
	@# pyflakes' other findings include generated code and intended redefinitions.
	! $(BIN)/python -m pyflakes prism bench tests | grep -E "undefined name|unable to detect undefined names"

protos: install
	$(BIN)/python scripts/gen_protos.py

protos-check: install
	$(BIN)/python scripts/gen_protos.py --check

test: install protos-check lint
	$(BIN)/python -m pytest -q --timeout=300 --durations=15 -n $(TEST_WORKERS) --dist loadgroup tests

bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
