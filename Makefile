# The two contract targets: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q
TORCH  := torch==2.13.0

.PHONY: setup browser node labextension lab demo test lint schemas bench kernel clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and exactly pinned: anything looser would pull a CUDA build from the registry.
$(VENV)/.torch-installed: | $(PY)
	$(PIP) $(TORCH)
	@touch $@

$(VENV)/.etlab-installed: pyproject.toml $(VENV)/.torch-installed $(LABEXT)
	$(PIP) -e '.[dev,lab]' $(TORCH)
	@touch $@

# The JupyterLab extension: TypeScript in labextension/, built with @jupyterlab/builder from the npm
# registry (lockfile committed) into etlab/jupyter/labextension, which the Python package ships as
# share/jupyter/labextensions/etlab-labextension. The builder needs JupyterLab's core package list.
LABEXT     := etlab/jupyter/labextension/package.json
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/*) labextension/package.json \
              labextension/package-lock.json labextension/tsconfig.json

node:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing Debian nodejs and npm to build the JupyterLab extension"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
	  || { echo "could not install nodejs/npm: run 'apt-get install nodejs npm' as root" >&2; exit 1; }; }

$(VENV)/.jupyterlab-installed: $(VENV)/.torch-installed
	$(PIP) 'jupyterlab>=4.2,<5' $(TORCH)
	@touch $@

$(LABEXT): $(LABEXT_SRC) $(VENV)/.jupyterlab-installed | node
	cd labextension && npm ci --no-audit --no-fund && npx tsc && \
	  node node_modules/@jupyterlab/builder/lib/build-labextension.js --core-path \
	  "$$($(abspath $(PY)) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .
	@touch $@

labextension: $(LABEXT)

setup: $(VENV)/.etlab-installed

# Headless Chromium for the browser tests (Debian's package; playwright only drives it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "could not install chromium: run 'apt-get install chromium' as root" >&2; exit 1; }; }

demo: setup
	$(PY) -m etlab.demo

# JupyterLab on 127.0.0.1 over this folder (the demo's artifacts in demo_out/, the notebooks); token auth.
lab: setup
	@test -f demo_out/run.etdp || $(PY) -m etlab.demo
	$(PY) -m jupyter lab --ServerApp.ip=127.0.0.1 --no-browser --ServerApp.root_dir=$(CURDIR) \
	  $$([ "$$(id -u)" = 0 ] && echo --ServerApp.allow_root=True)

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

clean:
	rm -rf $(VENV) build *.egg-info labextension/node_modules labextension/lib etlab/jupyter/labextension
