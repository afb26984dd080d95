"""The bundled verification's tolerance (issue 25 item 8): a documented default that float backends
meet, named in every report, changeable in the Python API and on the command line the Lab server
runs (`python -m etlab.jupyter._verify FILE --rtol R --atol A`), a bad value refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from etlab.devtools import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    check_tolerance,
    load_bundled_program,
    verify_bundled_program,
    verify_method_outputs,
)
from tests.runtime.test_bundled import make_bpte


def test_default_tolerance_is_named_in_the_report():
    assert (DEFAULT_RTOL, DEFAULT_ATOL) == (1e-4, 1e-6)
    data, _ = make_bpte()
    method = load_bundled_program(data).load_method("forward")
    report = verify_method_outputs(method, 0)
    assert report.ok and (report.rtol, report.atol) == (1e-4, 1e-6)
    assert "(rtol=0.0001, atol=1e-06): passed" in str(report)


def test_a_few_ulps_pass_the_default_a_wrong_value_does_not():
    # expected outputs 3e-7 off (what a float32 backend summing in another order gives near zero)
    data, _ = make_bpte(expected_shift=3e-7)
    program = load_bundled_program(data)
    assert all(verify_bundled_program(program))
    assert not any(verify_bundled_program(program, rtol=0.0, atol=1e-8))  # an absolute 1e-8 does not
    data, _ = make_bpte(expected_shift=1e-3)
    assert not any(verify_bundled_program(load_bundled_program(data)))
    assert all(verify_bundled_program(load_bundled_program(data), atol=2e-3))


@pytest.mark.parametrize("rtol, atol, bad", [(-1.0, 0.0, "rtol"), (0.0, float("nan"), "atol"),
                                             ("1e-3", 0.0, "rtol"), (0.0, True, "atol")])
def test_bad_tolerance_is_refused_by_name(rtol, atol, bad):
    with pytest.raises(ValueError, match=f"^{bad} must be a finite number >= 0"):
        check_tolerance(rtol, atol)
    data, _ = make_bpte()
    with pytest.raises(ValueError, match=f"^{bad} must be"):
        verify_method_outputs(load_bundled_program(data).load_method("forward"), 0, rtol, atol)


def _verify_cli(path, *args) -> dict:
    out = subprocess.run([sys.executable, "-m", "etlab.jupyter._verify", str(path), "m.bpte", *args],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_command_line_takes_the_tolerance(tmp_path):
    data, _ = make_bpte(expected_shift=1e-3)
    path = tmp_path / "m.bpte"
    path.write_bytes(data)
    strict = _verify_cli(path)
    assert strict["passed"] is False and (strict["rtol"], strict["atol"]) == (1e-4, 1e-6)
    loose = _verify_cli(path, "--atol", "2e-3")
    assert loose["passed"] is True and loose["atol"] == 2e-3 and loose["cases"][0]["atol"] == 2e-3
    assert _verify_cli(path, "--rtol", "x") == {"file": "m.bpte", "error": "ValueError: rtol: not a number: 'x'"}
