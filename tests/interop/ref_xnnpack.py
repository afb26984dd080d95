"""Upstream-side artifacts for the XNNPACK runtime tests (tests/interop/test_xnnpack_runtime.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack.py ET_REF.py ZOO.py NAME [NAME ...] --out DIR [--dynamic NAME ...]
      For each NAME (make_NAME in ZOO.py), float and quantized (et_ref's own recipe: upstream's
      XNNPACKQuantizer, per-channel), and for each --dynamic NAME dynamically quantized (the same
      quantizer with is_dynamic=True: int8 weights, activations quantized per row at run time),
      lowered with upstream's XnnpackPartitioner:
        DIR/{float,quantized,dynamic}/NAME/model.pte, inputs.pt, eager_outputs.pt
        upstream_outputs.pt   upstream's runtime (XNNPACK) on inputs.pt
        run.etdp              upstream's ETDump of that run (its per-op XNNPACK profiling events)
        aot_intermediates.pt  {debug handle: output} of the Edge graph the partitioner lowered,
                              captured the way upstream's calculate_numeric_gap captures them
"""

import argparse
import importlib.util
import os
import sys
import warnings

warnings.filterwarnings("ignore")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _quantize_dynamic(model, inputs):
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torch.export import export
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True,
                                                                                is_dynamic=True))
    with torch.no_grad():
        prepared = prepare_pt2e(export(model, tuple(inputs)).module(), quantizer)
        prepared(*inputs)
        return convert_pt2e(prepared)


def export_one(et_ref, zoo, name, variant, out):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.inspector._intermediate_output_capturer import IntermediateOutputCapturer
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime
    from torch.export import export

    os.makedirs(out, exist_ok=True)
    model, inputs = getattr(zoo, f"make_{name}")()
    if variant != "float":
        et_ref._load_quantized_kernels()
        model = et_ref._quantize(model, inputs) if variant == "quantized" else _quantize_dynamic(model, inputs)
    edge = to_edge_transform_and_lower(export(model, tuple(inputs)), partitioner=[XnnpackPartitioner()],
                                       generate_etrecord=True)
    et = edge.to_executorch()
    with open(os.path.join(out, "model.pte"), "wb") as f:
        f.write(et.buffer)
    torch.save(list(inputs), os.path.join(out, "inputs.pt"))
    with torch.no_grad():
        torch.save(_as_list(model(*inputs)), os.path.join(out, "eager_outputs.pt"))
        # the Edge graph before partitioning: its nodes carry the debug handles the XNNPACK nodes keep
        reference = et.get_etrecord().edge_dialect_program.module()
        captured = IntermediateOutputCapturer(reference).run_and_capture(*inputs)
    aot = {int(k[0]): v for k, v in captured.items() if len(k) == 1 and isinstance(v, torch.Tensor)}
    torch.save(aot, os.path.join(out, "aot_intermediates.pt"))

    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=0)
    outputs = program.load_method("forward").execute(list(inputs))
    torch.save([o for o in outputs], os.path.join(out, "upstream_outputs.pt"))
    program.write_etdump_result_to_file(os.path.join(out, "run.etdp"), os.devnull)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("et_ref")
    p.add_argument("zoo")
    p.add_argument("names", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--dynamic", nargs="*", default=[])
    a = p.parse_args()
    et_ref = _load(a.et_ref, "_et_ref")
    zoo = _load(a.zoo, "_ref_xnnpack_zoo")
    jobs = [(variant, name) for name in a.names for variant in ("float", "quantized")]
    for variant, name in jobs + [("dynamic", name) for name in a.dynamic]:
        export_one(et_ref, zoo, name, variant, os.path.join(a.out, variant, name))
        print(f"{variant}/{name} done", flush=True)


if __name__ == "__main__":
    main()
