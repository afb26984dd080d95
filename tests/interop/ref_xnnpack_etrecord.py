"""Upstream's side of tests/interop/test_xnnpack_etrecord.py: lowered modules' named data in ETRecords.

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_etrecord.py read ETRECORD
      Parses ETRECORD (etlab's record in upstream's layout) with upstream's parse_etrecord and prints one
      JSON line {"named": {key: sha256 of its bytes}} over the lowered modules of its edge program.

  $REF tests/interop/ref_xnnpack_etrecord.py write ZOO.py NAME DIR
      Lowers make_NAME() of ZOO.py with upstream's XnnpackPartitioner and writes DIR/NAME.etrecord
      (upstream's generate_etrecord of the lowered edge program and its executorch program),
      DIR/NAME.pte and DIR/NAME_inputs.pt; prints {"named": {key: sha256}} of the .pte's named data.
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import warnings

warnings.filterwarnings("ignore")


def _named(edge_program) -> dict:
    out = {}
    for _, module in edge_program.graph_module.named_modules():
        store = getattr(module, "named_data_store_output", None)
        if store is None:
            continue
        for key, entry in store.pte_data.items():
            out[key] = hashlib.sha256(bytes(store.buffers[entry.buffer_index])).hexdigest()
    return out


def cmd_read(a):
    from executorch.devtools.etrecord import parse_etrecord

    record = parse_etrecord(a.etrecord)
    edge = record.edge_dialect_program
    edge = edge["forward"] if isinstance(edge, dict) else edge
    print(json.dumps({"named": _named(edge)}), flush=True)


def cmd_write(a):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools import generate_etrecord
    from executorch.exir import to_edge_transform_and_lower

    spec = importlib.util.spec_from_file_location("_zoo", a.zoo)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    torch.manual_seed(0)
    model, inputs = getattr(zoo, f"make_{a.name}")()
    model.eval()
    edge = to_edge_transform_and_lower(torch.export.export(model, tuple(inputs)), partitioner=[XnnpackPartitioner()])
    lowered = copy.deepcopy(edge)
    et = edge.to_executorch()
    generate_etrecord(f"{a.dir}/{a.name}.etrecord", lowered, et)
    with open(f"{a.dir}/{a.name}.pte", "wb") as f:
        f.write(et.buffer)
    torch.save(list(inputs), f"{a.dir}/{a.name}_inputs.pt")
    print(json.dumps({"named": _named(lowered.exported_program())}), flush=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("etrecord")
    r.set_defaults(fn=cmd_read)
    w = sub.add_parser("write")
    w.add_argument("zoo")
    w.add_argument("name")
    w.add_argument("dir")
    w.set_defaults(fn=cmd_write)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
