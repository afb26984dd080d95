"""The runtime tests run on both cores: `runtime_core` makes every `Runtime.get()` program use one.

Import the fixture into a test module (or a conftest) to run its tests once per core. The native
core is part of the project's set-up (`pip install --no-build-isolation -e .`), so a missing
build fails its tests instead of skipping them.
"""

from __future__ import annotations

import pytest

from etlab.runtime import _native

CORES = ("native", "python")


@pytest.fixture(params=CORES, autouse=True)
def runtime_core(request, monkeypatch) -> str:
    core = request.param
    if core == "native" and not _native.available():
        pytest.fail(f"the native runtime core is not built: {_native.unavailable_reason()}; {_native.BUILD_HINT}")
    monkeypatch.setenv("ETLAB_RUNTIME_CORE", core)
    return core
