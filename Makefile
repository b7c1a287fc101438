# minitransformer: `make book` builds the book, `make test` runs every check.
# Both create the virtual environment .venv on first use (Python 3.10+ needed).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NB     ?=

.PHONY: help venv book test export execute bench clean

help:
	@echo "make book     build the book into _build/html"
	@echo "make test     export drift, unit tests, nbval on every chapter, strict book build"
	@echo "make export   regenerate minitransformer/ from the notebooks"
	@echo "make execute  re-run notebooks in place, saving outputs (NB=nbs/01_mixing.ipynb for one)"
	@echo "make bench    benchmark scripts in bench/ (ratios against torch references)"

# The environment: the package in editable mode with its pinned dev toolchain (settings.ini).
$(STAMP): settings.ini setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

venv: $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . --warningiserror --keep-going
	@echo
	@echo "The book is in _build/html. Open _build/html/index.html in a browser, or serve it:"
	@echo "    $(PYTHON) -m http.server -d _build/html 8000    # then visit http://localhost:8000"

export: $(STAMP)
	$(BIN)/nbdev_export

execute: $(STAMP)
	$(BIN)/python scripts/execute_nbs.py $(NB)

# A fresh strict build (--all: warnings of unchanged pages count too), then one pytest run:
# export drift and project checks (tests/), nbval on every chapter, the built HTML.
test: $(STAMP)
	$(BIN)/jupyter-book build . --all --warningiserror --keep-going --quiet
	$(BIN)/python -m pytest -p no:cacheprovider --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg nbs tests

clean:
	rm -rf _build

# Speed comparisons side by side in one process (not part of `make test`: timings are noisy).
bench: $(STAMP)
	$(BIN)/python bench/bench_mha.py
