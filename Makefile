# The two contract targets: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q
TORCH  := torch==2.13.0

.PHONY: setup browser demo test lint schemas bench kernel fuzz clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and exactly pinned: anything looser would pull a CUDA build from the registry.
$(VENV)/.torch-installed: | $(PY)
	$(PIP) $(TORCH)
	@touch $@

$(VENV)/.etlab-installed: pyproject.toml $(VENV)/.torch-installed
	$(PIP) -e '.[dev]' $(TORCH)
	@touch $@

setup: $(VENV)/.etlab-installed

# Headless Chromium for the browser tests (Debian's package; playwright only drives it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "could not install chromium: run 'apt-get install chromium' as root" >&2; exit 1; }; }

demo: setup
	$(PY) -m etlab.demo

test: setup browser
	$(PY) -m pytest -n 2 --dist loadgroup -q

# The notebooks declare a kernel named "etlab": this registers the venv's python under that name.
kernel: setup
	$(PY) -m ipykernel install --user --name etlab --display-name "etlab (Python 3)"

lint: setup
	$(PY) -m ruff check etlab tests bench

schemas: setup
	$(PY) -m etlab.schema._generate

bench: setup
	$(PY) bench/run_all.py

# The standing fuzz campaign (tests/fuzz): every loader, load+execute, Inspector+report, for a time
# budget; saves reproducers under tests/fuzz/reproducers/ and rewrites the Robustness section of bench/RESULTS.md.
FUZZ_SECONDS ?= 600
FUZZ_WORKERS ?= 2
fuzz: setup
	$(PY) -m tests.fuzz.campaign --seconds $(FUZZ_SECONDS) --workers $(FUZZ_WORKERS)

clean:
	rm -rf $(VENV) build *.egg-info
