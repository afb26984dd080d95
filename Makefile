# The two contract targets: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q
TORCH  := torch==2.13.0

.PHONY: setup browser jdk demo test test-spark lint schemas bench kernel clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and exactly pinned: anything looser would pull a CUDA build from the registry.
$(VENV)/.torch-installed: | $(PY)
	$(PIP) $(TORCH)
	@touch $@

# The native runtime core (etlab/runtime/_native) compiles against the installed torch, so the
# build tools come first and etlab installs without build isolation (2 compile jobs, -O2).
NATIVE_SRC := setup.py $(wildcard etlab/runtime/_native/*.cpp etlab/runtime/_native/*.h)

$(VENV)/.build-tools-installed: $(VENV)/.torch-installed
	$(PIP) 'setuptools>=68' 'pybind11>=2.12' ninja
	@touch $@

$(VENV)/.etlab-installed: pyproject.toml $(NATIVE_SRC) $(VENV)/.build-tools-installed
	MAX_JOBS=2 $(PIP) --no-build-isolation -e '.[dev]' $(TORCH)
	@touch $@

setup: $(VENV)/.etlab-installed

# Headless Chromium for the browser tests (Debian's package; playwright only drives it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "could not install chromium: run 'apt-get install chromium' as root" >&2; exit 1; }; }

# A JDK for Spark (etlab.fleet's cluster path, tested in local mode): Debian's default, 17 on bookworm.
jdk:
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Debian's JDK for the Spark tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless >/dev/null) \
	  || { echo "could not install a JDK: run 'apt-get install default-jdk-headless' as root" >&2; exit 1; }; }

demo: setup
	$(PY) -m etlab.demo

test: setup browser jdk
	$(PY) -m pytest -n 2 --dist loadgroup -q

# The Spark tests alone (they are part of `make test` too).
test-spark: setup jdk
	$(PY) -m pytest -q -m spark tests/fleet

# The notebooks declare a kernel named "etlab": this registers the venv's python under that name.
kernel: setup
	$(PY) -m ipykernel install --user --name etlab --display-name "etlab (Python 3)"

lint: setup
	$(PY) -m ruff check etlab tests bench

schemas: setup
	$(PY) -m etlab.schema._generate

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info etlab/runtime/_native/*.so
