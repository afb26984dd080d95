"""Upstream's side of tests/interop/test_xnnpack_etrecord.py: lowered modules' named data in ETRecords.

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_etrecord.py [--read ETRECORD] [--write ZOO.py NAME DIR]
      --read: parses ETRECORD (etlab's record in upstream's layout) with upstream's parse_etrecord and
      prints one JSON line {"read": {key: sha256 of its bytes}} over the lowered modules of its edge program.
      --write: lowers make_NAME() of ZOO.py with upstream's XnnpackPartitioner and writes DIR/NAME.etrecord
      (upstream's generate_etrecord of the lowered edge program and its executorch program), DIR/NAME.pte
      and DIR/NAME_inputs.pt; prints {"written": {key: sha256}} of the lowered modules' named data.
      Both in one process: importing upstream is most of the time.
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


def read(path):
    from executorch.devtools.etrecord import parse_etrecord

    record = parse_etrecord(path)
    edge = record.edge_dialect_program
    edge = edge["forward"] if isinstance(edge, dict) else edge
    print(json.dumps({"read": _named(edge)}), flush=True)


def write(zoo_path, name, out):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools import generate_etrecord
    from executorch.exir import to_edge_transform_and_lower

    spec = importlib.util.spec_from_file_location("_zoo", zoo_path)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    torch.manual_seed(0)
    model, inputs = getattr(zoo, f"make_{name}")()
    model.eval()
    edge = to_edge_transform_and_lower(torch.export.export(model, tuple(inputs)), partitioner=[XnnpackPartitioner()])
    lowered = copy.deepcopy(edge)
    et = edge.to_executorch()
    generate_etrecord(f"{out}/{name}.etrecord", lowered, et)
    with open(f"{out}/{name}.pte", "wb") as f:
        f.write(et.buffer)
    torch.save(list(inputs), f"{out}/{name}_inputs.pt")
    print(json.dumps({"written": _named(lowered.exported_program())}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--read", metavar="ETRECORD")
    p.add_argument("--write", nargs=3, metavar=("ZOO", "NAME", "DIR"))
    a = p.parse_args()
    if a.read:
        read(a.read)
    if a.write:
        write(*a.write)


if __name__ == "__main__":
    main()
