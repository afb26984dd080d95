"""Models users bring against torch eager; writes the `## runtime-holdout` section of bench/RESULTS.md.

Real-library architectures (torchvision, timm, torchaudio, transformers from etlab.models.corpus, and an LSTM
keyword spotter defined here), compiled by etlab (portable, no delegate), run on etlab's native core and timed
against torch eager in the same alternating rounds (bench/_runtime_timing.py), target <= 1.1x eager (issue #27).

    .venv/bin/python bench/runtime_holdout.py [lstm_kws tv_swin_t ...] [--rounds 30] [--threads 1] [--clock cpu]

(`bench/runtime.py --holdout [models]` runs the same.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_section
from _runtime_timing import CLOCKS, SETTINGS, clock_words, configure, interleaved, met

from etlab.runtime import Runtime

# Holdout models (issue #27): real-library architectures a user brings, timed against torch eager. From
# etlab.models.corpus, plus an LSTM keyword-spotting model defined here (the corpus has no LSTM speech model).
HOLDOUT = ["lstm_kws", "lstm_bidir_2layer", "gru", "ta_deepspeech", "ta_wavernn", "timm_vit_tiny_patch16_224",
           "tv_vit_b_32_small", "vit", "timm_swin_tiny_patch4_window7_224", "tv_swin_t", "swin"]
TARGET_EAGER = 1.1


class LstmKeywordSpotter(torch.nn.Module):
    """Speech-commands style: 49 frames of 40 log-mel features -> 2-layer LSTM (128) -> 12 keyword logits."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(40, 128, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(128, 12)

    def forward(self, mel):
        out, _ = self.lstm(mel)
        return self.head(out[:, -1])


def _holdout_model(name: str) -> tuple[torch.nn.Module, list]:
    if name == "lstm_kws":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return LstmKeywordSpotter().eval(), [torch.randn(1, 49, 40)]
    from etlab.models.corpus import CORPUS

    module, methods = CORPUS[name].build()
    return module, list(methods["forward"])


def time_holdout(name: str, rounds: int) -> dict[str, float]:
    """etlab's native core (etlab-compiled program) against eager on one holdout model, interleaved."""
    from etlab.compiler import to_edge
    from etlab.models.corpus import flat_tensors, max_abs_error

    module, inputs = _holdout_model(name)
    with torch.no_grad():
        program = to_edge(torch.export.export(module, tuple(inputs))).to_executorch().buffer
        method = Runtime.get().load_program(program, threads=SETTINGS.threads).load_method("forward")
        error = max_abs_error(method.execute(inputs), flat_tensors(module(*inputs)))

        def eager():
            with torch.no_grad():
                return module(*inputs)

        start = time.perf_counter()
        eager()
        per_round = max(1, min(20, int(5e-3 / max(time.perf_counter() - start, 1e-6))))
        result = interleaved({"eager": eager, "etlab": lambda: method.execute(inputs)}, rounds=rounds,
                             per_round=per_round)
    result["error"] = error
    return result


def holdout_section(results: dict[str, dict[str, float]], clock: str, threads: int, loads: tuple[float, float]
                    ) -> str:
    lines = [
        "## runtime-holdout", "",
        "`bench/runtime_holdout.py` (`bench/runtime.py --holdout`), "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average "
        f"{loads[0]:.1f} before / {loads[1]:.1f} after{' (other jobs share the machine)' if max(loads) > 2 else ''}. "
        "Models users bring (torchvision, timm, torchaudio, transformers from etlab.models.corpus, and an LSTM "
        "keyword spotter defined in the bench), compiled by etlab (portable, no delegate) and run on etlab's "
        "native core, against torch eager (`torch.no_grad`) in the same alternating rounds, "
        f"{clock_words(clock)}, {threads} thread(s) on both sides. Medians; "
        "in brackets the interquartile range of the rounds relative to the median.", "",
        "| model | eager ms | etlab ms | etlab / eager | max abs error | target |",
        "|---|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        ratio = r["etlab"] / r["eager"]
        lines.append(f"| {name} | {r['eager'] * 1e3:.3f} [{r['eager~']:.0%}] | {r['etlab'] * 1e3:.3f} "
                     f"[{r['etlab~']:.0%}] | {ratio:.2f}x | {r['error']:.1e} | <= {TARGET_EAGER}: "
                     f"{met(ratio <= TARGET_EAGER)} |")
    return "\n".join([*lines, ""])


def run(models: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Times `models` (all when empty) and writes the section; the clock and threads as `configure` set them."""
    load_before = os.getloadavg()[0]
    holdout = {}
    for m in models or HOLDOUT:
        holdout[m] = time_holdout(m, rounds)
        print(f"holdout {m}: etlab / eager {holdout[m]['etlab'] / holdout[m]['eager']:.2f}x "
              f"({holdout[m]['etlab'] * 1e3:.3f} / {holdout[m]['eager'] * 1e3:.3f} ms)", flush=True)
    write_section("runtime-holdout", holdout_section(holdout, SETTINGS.clock_name, SETTINGS.threads,
                                                     (load_before, os.getloadavg()[0])))
    return holdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help=f"these models (none named: all): {', '.join(HOLDOUT)}")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    a = ap.parse_args()
    unknown = [m for m in a.models if m not in HOLDOUT]
    if unknown:  # (argparse's choices refuse an empty positional list)
        ap.error(f"unknown model(s) {', '.join(unknown)} (choose from {', '.join(HOLDOUT)})")
    configure(a.clock, a.threads)
    run(a.models, a.rounds)


if __name__ == "__main__":
    main()
