# The two contract targets: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q
TORCH  := torch==2.13.0
# The prebuilt JupyterLab extension (built from labextension/ by the labextension target below).
LABEXT := etlab/jupyter/labextension/package.json

.PHONY: setup browser jdk node labextension lab lab-server demo test test-fast test-spark lint schemas bench kernel fuzz sanitize corpus corpus-speed wheel-check clean

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

$(VENV)/.etlab-installed: pyproject.toml $(NATIVE_SRC) $(VENV)/.build-tools-installed $(LABEXT)
	MAX_JOBS=2 $(PIP) --no-build-isolation -e '.[dev,lab,corpus]' $(TORCH)
	@touch $@

# The JupyterLab extension: TypeScript in labextension/, built with @jupyterlab/builder from the npm
# registry (lockfile committed) into etlab/jupyter/labextension, which the Python package ships as
# share/jupyter/labextensions/etlab-labextension. The builder needs JupyterLab's core package list.
# The extension also bundles the views' formatters and element builders (etlab/visualizer/static) and compiles
# against contract.d.ts, generated from the server's TypedDicts (etlab/jupyter/_contract/) first.
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/*) labextension/package.json \
              labextension/package-lock.json labextension/tsconfig.json \
              etlab/jupyter/_contract_ts.py $(wildcard etlab/jupyter/_contract/*.py) \
              etlab/visualizer/static/format.js etlab/visualizer/static/elements.js

node:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing Debian nodejs and npm to build the JupyterLab extension"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
	  || { echo "could not install nodejs/npm: run 'apt-get install nodejs npm' as root" >&2; exit 1; }; }

$(VENV)/.jupyterlab-installed: $(VENV)/.torch-installed
	$(PIP) 'jupyterlab>=4.2,<5' $(TORCH)
	@touch $@

$(LABEXT): $(LABEXT_SRC) $(VENV)/.jupyterlab-installed | node
	$(PY) etlab/jupyter/_contract_ts.py labextension/src/contract.d.ts
	cd labextension && npm ci --no-audit --no-fund && npx tsc && \
	  node node_modules/@jupyterlab/builder/lib/build-labextension.js --core-path \
	  "$$($(abspath $(PY)) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .
	cp labextension/install.json $(dir $(LABEXT))install.json  # the builder empties its output folder
	@touch $@

labextension: $(LABEXT)

# `pip install -e` does not install [tool.setuptools.data-files] (a wheel does), so the editable venv gets
# the extension here, where JupyterLab and jupyter_server look in it: the built extension linked into
# share/jupyter/labextensions (with install.json, so `jupyter labextension list` names the package) and
# the server extension enabled by the same etc/jupyter config file the wheel installs. Idempotent.
LABEXT_DIR := $(abspath $(dir $(LABEXT)))
$(VENV)/.lab-enabled: $(VENV)/.etlab-installed $(LABEXT) labextension/install.json etlab/jupyter/config/etlab.json
	cp labextension/install.json $(LABEXT_DIR)/install.json  # also into an extension built before it was copied
	mkdir -p $(VENV)/share/jupyter/labextensions $(VENV)/etc/jupyter/jupyter_server_config.d
	rm -rf $(VENV)/share/jupyter/labextensions/etlab-labextension
	ln -s $(LABEXT_DIR) $(VENV)/share/jupyter/labextensions/etlab-labextension
	cp etlab/jupyter/config/etlab.json $(VENV)/etc/jupyter/jupyter_server_config.d/etlab.json
	$(PY) -m ipykernel install --sys-prefix --name etlab --display-name "etlab (Python 3)" >/dev/null
	@touch $@

# Model Explorer for etlab.model_explorer's tests: its pure-Python package and what it imports. Its C++
# adapter package (128 MB, TFLite/MLIR readers etlab does not use) is left out: Model Explorer runs without it.
# Its requirements go first: pip's dependency check, run when they are installed after it, would print an
# ERROR line about the adapter it leaves out (a --no-deps install is not checked).
ME_REQS := flask dacite portpicker termcolor watchdog requests
$(VENV)/.model-explorer-installed: $(VENV)/.torch-installed
	$(PIP) $(ME_REQS) $(TORCH)
	$(PIP) --no-deps 'ai-edge-model-explorer==0.1.34'
	@touch $@

# The model corpus's libraries (etlab.models.corpus, make corpus): torchvision, torchaudio and timm with
# --no-deps, because their wheels pin or pull another torch; their real requirements come after (pillow
# for torchvision; timm's pyyaml, huggingface_hub and safetensors arrive with transformers, the corpus
# extra). torchvision 0.28 is the release for torch 2.13; torchaudio 2.11 is the newest the registry
# has. Their compiled extensions are CUDA builds that do not load here: see
# etlab/models/corpus/_library_imports.py for how their model code is imported anyway.
CORPUS_LIBS := torchvision==0.28.0 torchaudio==2.11.0 timm==1.0.31
$(VENV)/.corpus-libs-installed: $(VENV)/.etlab-installed
	$(PIP) --no-deps $(CORPUS_LIBS)
	$(PIP) 'pillow>=9' pyyaml huggingface_hub safetensors $(TORCH)
	@touch $@

setup: $(VENV)/.etlab-installed $(VENV)/.lab-enabled $(VENV)/.model-explorer-installed $(VENV)/.corpus-libs-installed

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

# JupyterLab on 127.0.0.1 over this folder (the demo's artifacts in demo_out/, the notebooks); token auth.
# LAB_ROOT serves another folder; LAB_ARGS adds server options (the browser tests pass a port and a token).
LAB_ROOT ?= $(CURDIR)
LAB_ARGS ?=
lab: setup
	@test -f demo_out/run.etdp || $(PY) -m etlab.demo
	@$(MAKE) --no-print-directory lab-server

# The server alone, on the venv as it is (what `make lab` ends with; tests/jupyter starts JupyterLab this way).
lab-server:
	$(PY) -m jupyter lab --ServerApp.ip=127.0.0.1 --no-browser --ServerApp.root_dir=$(LAB_ROOT) \
	  $$([ "$$(id -u)" = 0 ] && echo --ServerApp.allow_root=True) $(LAB_ARGS)

test: setup browser jdk
	$(PY) -m pytest -n 2 --dist loadgroup -q

# The edit loop's lane: all but the interop (upstream), browser (Chromium), Spark, corpus and slow tests
# (markers in pyproject.toml; `browser` is set by tests/conftest.py). `make test` still runs everything.
FAST := not interop and not browser and not spark and not slow and not corpus
test-fast: setup
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "$(FAST)"

# The Spark tests alone (they are part of `make test` too).
test-spark: setup jdk
	$(PY) -m pytest -q -m spark tests/fleet

# The notebooks declare a kernel named "etlab": this registers the venv's python under that name.
kernel: setup
	$(PY) -m ipykernel install --user --name etlab --display-name "etlab (Python 3)"

# ruff; pyright (its scope and settings: [tool.pyright] in pyproject.toml) and eslint (labextension/src and the
# view modules, labextension/eslint.config.mjs), both from labextension's npm devDependencies (pinned by its
# lockfile, installed by `npm ci` in the labextension target).
LINT_BIN := labextension/node_modules/.bin
$(LINT_BIN)/eslint: | node  # only when missing (node_modules deleted after the extension was built)
	cd labextension && npm ci --no-audit --no-fund

lint: setup | $(LINT_BIN)/eslint
	$(PY) -m ruff check etlab tests bench
	$(LINT_BIN)/pyright
	$(LINT_BIN)/eslint -c labextension/eslint.config.mjs labextension/src etlab/visualizer/static

schemas: setup
	$(PY) -m etlab.schema._generate

bench: setup
	$(PY) bench/run_all.py

# The runtime tests on a native core built with ASan, UBSan, assertions and pybind11's GIL checks, in
# build/sanitize (the in-place build stays as it is); any report fails the run (tests/runtime/sanitize.py).
sanitize: setup
	$(PY) -m tests.runtime.sanitize

# The standing fuzz campaign (tests/fuzz): every loader, load+execute, Inspector+report, for a time
# budget; saves reproducers under tests/fuzz/reproducers/ and rewrites the Robustness section of bench/RESULTS.md.
FUZZ_SECONDS ?= 600
FUZZ_WORKERS ?= 2
fuzz: setup
	$(PY) -m tests.fuzz.campaign --seconds $(FUZZ_SECONDS) --workers $(FUZZ_WORKERS)

# The whole model corpus: every architecture compiled, run and inspected next to upstream, upstream's
# compile timed next to etlab's for each model measured (1-3 min per model on 2 loaded cores; kept rows
# that are current are skipped, bench/_corpus_rows.py); rewrites the corpus section of bench/RESULTS.md.
# `make test` runs a fast subset (tests/corpus).
corpus: setup
	status=0; $(PY) bench/corpus.py --parallel 2 || status=$$?; \
	ETLAB_CORPUS_FULL=1 $(PY) -m pytest -n 2 --dist loadgroup -q tests/corpus && exit $$status

# etlab's and upstream's compile of every corpus model, interleaved in one run (~30 min on 2 loaded cores);
# rewrites the `corpus compile speed` section of bench/RESULTS.md.
corpus-speed: setup
	$(PY) bench/corpus_speed.py

# etlab as someone without this Makefile installs it: a clean clone of HEAD, `python -m build` (isolated:
# build requirements from pyproject.toml, the Lab extension built with npm, the native core against
# torch 2.13.0), the wheel installed in a fresh venv and checked (10-30 min; tests/wheelcheck/clean_clone_wheel.py).
wheel-check: setup | node
	$(PY) -m tests.wheelcheck.clean_clone_wheel

clean:
	rm -rf $(VENV) build *.egg-info etlab/runtime/_native/*.so labextension/node_modules labextension/lib \
	  etlab/jupyter/labextension
