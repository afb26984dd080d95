"""Runs every test case of a .bpte with upstream's runtime (reference python only).

usage: ref_bundled.py BPTE --json OUT
Writes {"method": ..., "cases": [{"index": i, "passed": bool, "outputs": [...sha256...]}]}.
"""
import argparse
import hashlib
import json
import logging
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bpte")
    p.add_argument("--json", required=True)
    p.add_argument("--method", default="forward")
    a = p.parse_args()
    from executorch.extension.pybindings import portable_lib as pl

    data = open(a.bpte, "rb").read()
    bundle = pl._load_bundled_program_from_buffer(data)
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    n = sum(len(s.test_cases) for s in deserialize_from_flatbuffer_to_bundled_program(data).method_test_suites
            if s.method_name == a.method)
    cases = []
    for i in range(n):
        # Loads test case i's inputs, executes, and compares with its expected outputs.
        try:
            outs = bundle.verify_result_with_bundled_expected_output(a.method, i, 1e-5, 1e-6)
            passed = True
        except Exception:  # upstream signals a mismatch by raising
            outs, passed = [], False
        digests = [hashlib.sha256(o.contiguous().numpy().tobytes()).hexdigest() for o in outs]
        cases.append({"index": i, "passed": passed, "outputs": digests})
    with open(a.json, "w") as f:
        json.dump({"method": a.method, "cases": cases}, f)
    print(json.dumps({"cases": len(cases)}))


if __name__ == "__main__":
    main()
