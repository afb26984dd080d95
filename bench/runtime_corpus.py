"""Every corpus model against torch eager on etlab's native core; writes the `## runtime-corpus` section.

Issue #27's proof "etlab / torch eager <= 1.1 on every corpus model": each model of etlab.models.corpus (plus the
holdout's LSTM keyword spotter) compiled by etlab (portable, no delegate), every method run on etlab's native
core and timed against the same method in torch eager (`torch.no_grad`) in alternating rounds, 1 thread on both
sides, thread CPU time, medians (bench/_runtime_timing.py, as bench/runtime_holdout.py does for its 11 models).

The whole corpus does not fit in one run on a shared machine, so results accumulate: each model's result is
merged into bench/runtime_corpus.json as soon as it is measured (a later run replaces that model's entry only)
and the section is rewritten from the whole file. `--next N` measures the N cheapest models not yet in the file
(cost = one eager call, probed once and kept in the file), so runs in a loop walk the corpus cheapest first.

    .venv/bin/python bench/runtime_corpus.py --next 10 [--rounds 20]
    .venv/bin/python bench/runtime_corpus.py tv_resnet18 bert [--rounds 30]
    .venv/bin/python bench/runtime_corpus.py --write        # only re-render the section from the file
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from statistics import median

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import write_section  # noqa: E402
from _runtime_timing import CLOCKS, SETTINGS, clock_words, configure, interleaved, met  # noqa: E402
from runtime_holdout import TARGET_EAGER, LstmKeywordSpotter  # noqa: E402

from etlab.runtime import Runtime  # noqa: E402
from etlab.schema import write_atomic  # noqa: E402

STORE = HERE / "runtime_corpus.json"
EXTRA = "lstm_kws"  # the holdout's LSTM keyword spotter (not a corpus entry)
BATCH_S = 5e-3  # calls per timed batch: enough for about this much eager time (1 to 20 calls)


def all_models() -> list[str]:
    from etlab.models.corpus import CORPUS

    return [EXTRA, *CORPUS]


def _build(name: str):
    """(module, {method: inputs}, compile config) of a corpus entry or the keyword spotter."""
    if name == EXTRA:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return LstmKeywordSpotter().eval(), {"forward": (torch.randn(1, 49, 40),)}, None, (1e-4, 1e-4)
    from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass
    from etlab.models.corpus import CORPUS, SHARED_STATE

    entry = CORPUS[name]
    module, methods = entry.build()
    config = (ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))
              if SHARED_STATE in entry.tags else None)
    return module, methods, config, (entry.atol, entry.rtol)


def _compile(name: str, module, methods, config) -> bytes:
    from etlab.compiler import to_edge
    from etlab.models.corpus import CORPUS

    if name == EXTRA:
        with torch.no_grad():
            programs = {"forward": torch.export.export(module, tuple(methods["forward"]))}
    else:
        programs = CORPUS[name].export((module, methods))
    return bytes(to_edge(programs).to_executorch(config).buffer)


def _eager_fn(module, method: str, inputs):
    fn = getattr(module, method)

    def eager():
        with torch.no_grad():
            return fn(*inputs)
    return eager


def probe(name: str) -> float:
    """Thread CPU seconds of building the model and one eager call of each method: the cost to sort by."""
    start = time.thread_time()
    module, methods, _, _ = _build(name)
    for m, ins in methods.items():
        _eager_fn(module, m, ins)()
    return time.thread_time() - start


def time_model(name: str, rounds: int) -> dict:
    """One model, every method: etlab's native core against eager, interleaved, plus output errors."""
    from etlab.models.corpus import flat_tensors, max_abs_error, within_tolerance

    t0 = time.thread_time()
    module, methods, config, (atol, rtol) = _build(name)
    expected = {m: flat_tensors(_eager_fn(module, m, ins)()) for m, ins in methods.items()}
    t1 = time.thread_time()
    pte = _compile(name, module, methods, config)
    compile_s = time.thread_time() - t1
    program = Runtime.get().load_program(pte, threads=SETTINGS.threads)
    out: dict = {"methods": {}, "compile_s": compile_s, "load": [os.getloadavg()[0]]}
    for m, ins in methods.items():
        method = program.load_method(m)
        ins = list(ins)
        got = list(method.execute(ins))
        # first-call outputs, before any state (KV caches) advances; later calls only get timed
        ok = len(got) == len(expected[m]) and all(within_tolerance(g, w, atol, rtol)
                                                  for g, w in zip(got, expected[m]))
        eager = _eager_fn(module, m, tuple(ins))
        start = time.thread_time()
        eager()
        per_round = max(1, min(20, int(BATCH_S / max(time.thread_time() - start, 1e-6))))
        r = interleaved({"eager": eager, "etlab": lambda method=method, ins=ins: method.execute(ins)},
                        rounds=rounds, per_round=per_round)
        out["methods"][m] = {**r, "error": max_abs_error(got, expected[m]), "ok": ok, "per_round": per_round}
    out["load"].append(os.getloadavg()[0])
    out.update(rounds=rounds, threads=SETTINGS.threads, clock=SETTINGS.clock_name, date=time.strftime("%Y-%m-%d"),
               time=time.strftime("%H:%M", time.gmtime()),
               total_s=time.thread_time() - t0)
    return out


def load_store(path: Path = STORE) -> dict:
    if not path.is_file():
        return {"models": {}, "probe": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON ({e}); fix or delete it to start over") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise SystemExit(f"{path}: expected an object with a 'models' object")
    data.setdefault("probe", {})
    return data


def save_store(data: dict, path: Path = STORE) -> None:
    write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def _ratio(r: dict) -> float:
    return r["etlab"] / r["eager"] if r["eager"] else float("inf")


def rows(data: dict) -> list[tuple[str, str, dict]]:
    """(model, method, result) for every measured method, corpus order."""
    return [(name, m, r) for name in all_models() if "methods" in data["models"].get(name, {})
            for m, r in data["models"][name]["methods"].items()]


def section(data: dict) -> str:
    names = all_models()
    measured = rows(data)
    ratios = [_ratio(r) for _, _, r in measured]
    over = [f"{n}{'' if m == 'forward' else '.' + m} ({_ratio(r):.2f}x)" for n, m, r in measured
            if _ratio(r) > TARGET_EAGER]
    failed = {n: e["failed"] for n, e in data["models"].items() if "failed" in e}
    missing = [n for n in names if n not in data["models"]]
    loads = [x for e in data["models"].values() for x in e.get("load", [])]
    dates = sorted({e["date"] for e in data["models"].values() if "date" in e})
    done = sum(1 for n in names if "methods" in data["models"].get(n, {}))
    lines = [
        "## runtime-corpus", "",
        "`bench/runtime_corpus.py` (results accumulate in `bench/runtime_corpus.json`: each run measures some "
        "models, cheapest first, and this section is rewritten from all of them). Every model of "
        "etlab.models.corpus plus the holdout's LSTM keyword spotter, compiled by etlab (portable, no delegate), "
        "each method run on etlab's native core against the same method in torch eager (`torch.no_grad`) in "
        f"alternating rounds, {clock_words(SETTINGS.clock_name)}, 1 thread on both sides; medians, in brackets "
        "the interquartile range of the rounds relative to the median. Errors: first call, max |etlab - eager|; "
        "`tol` = within the entry's tolerance. "
        f"Measured {', '.join(dates) or 'never'}, 2 cores shared with other jobs (load average "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} during the runs).", "",
        f"**{done} of {len(names)} models measured** ({len(measured)} methods); etlab / eager median "
        f"{median(ratios) if ratios else float('nan'):.2f}x, max {max(ratios, default=float('nan')):.2f}x; "
        f"target <= {TARGET_EAGER} on every model: "
        f"{met(not over and not missing and not failed)}.", ""]
    if over:
        lines += [f"Above {TARGET_EAGER}: {', '.join(over)}.", ""]
    if failed:
        lines += ["Not measured (failed): " + "; ".join(f"{n}: {why}" for n, why in failed.items()) + ".", ""]
    if missing:
        lines += [f"Not reached yet ({len(missing)}): {', '.join(missing)}.", ""]
    lines += ["| model | method | measured (UTC) | eager ms | etlab ms | etlab / eager | max abs error | tol | "
              "target |", "|---|---|---|---:|---:|---:|---:|---|---|"]
    for n, m, r in measured:
        ratio = _ratio(r)
        when = data["models"][n].get("time", "before 20:10")
        lines.append(f"| {n} | {m} | {when} | {r['eager'] * 1e3:.3f} [{r['eager~']:.0%}] | {r['etlab'] * 1e3:.3f} "
                     f"[{r['etlab~']:.0%}] | {ratio:.2f}x | {r['error']:.1e} | {'ok' if r['ok'] else 'NO'} | "
                     f"{met(ratio <= TARGET_EAGER)} |")
    notes = data.get("notes", "")
    return "\n".join([*lines, *(["", notes] if notes else []), ""])


def pick_next(data: dict, count: int) -> list[str]:
    """The `count` cheapest models not yet in the store (probing each unprobed model once)."""
    todo = [n for n in all_models() if n not in data["models"]]
    for n in todo:
        if n not in data["probe"]:
            try:
                data["probe"][n] = probe(n)
            except Exception as e:  # a model that cannot even be built is recorded, not retried every run
                data["probe"][n] = float("inf")
                print(f"probe {n}: {type(e).__name__}: {e}", flush=True)
            save_store(data)
    return sorted(todo, key=lambda n: data["probe"][n])[:count]


def run(models: list[str], rounds: int) -> None:
    for name in models:
        try:
            result = time_model(name, rounds)
        except Exception as e:
            traceback.print_exc()
            result = {"failed": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                      "date": time.strftime("%Y-%m-%d")}
        data = load_store()  # re-read: another run may have merged meanwhile
        data["models"][name] = result
        save_store(data)
        write_section("runtime-corpus", section(data))
        for m, r in result.get("methods", {}).items():
            print(f"{name}.{m}: etlab / eager {_ratio(r):.2f}x ({r['etlab'] * 1e3:.3f} / {r['eager'] * 1e3:.3f} "
                  f"ms) err {r['error']:.1e}", flush=True)
        if "failed" in result:
            print(f"{name}: FAILED {result['failed']}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="these models (corpus names or lstm_kws)")
    ap.add_argument("--next", type=int, default=0, metavar="N", help="the N cheapest models not yet measured")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--write", action="store_true", help="only rewrite the section from the stored results")
    a = ap.parse_args(argv)
    known = set(all_models())
    unknown = [m for m in a.models if m not in known]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)} (corpus names or {EXTRA})")
    configure(a.clock, 1)
    data = load_store()
    if a.write:
        write_section("runtime-corpus", section(data))
        return
    models = list(a.models) + (pick_next(data, a.next) if a.next else [])
    if not models:
        ap.error("name models, or --next N, or --write")
    run(models, a.rounds)


if __name__ == "__main__":
    main()
