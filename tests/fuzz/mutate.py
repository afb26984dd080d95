"""Structure-aware mutators: where offsets, lengths, enums and counts live, and values that break them.

Random bytes rarely get past a FlatBuffer verifier or a zip's CRC, so most mutations here know
the file's structure:

- `FlatMap`: every field of a seed's FlatBuffer found by walking it with the schema layouts
  (`etlab.schema._generated.layouts`): table offsets, vtable slots, vector lengths, union tags,
  enums and scalars, each with its position and width. Mutations overwrite one such field with a
  boundary value, aim an offset at another object (aliasing, cycles) or resize a vector.
- Model mutations: decode the seed into the schema dataclasses, change one leaf (an index, a
  size, an enum, a list) and encode it again: a well-formed file with hostile meaning, the
  input that reaches the runtime's and the Inspector's checks behind the verifier.
- JSON and zip mutations for ETRecords: change one node of the manifest and re-zip, or damage
  the zip's own headers.
- Byte mutations (flips, boundary words, splices, truncation) on top, for anything else.

Everything is driven by one `random.Random`, so a worker's stream of inputs is reproducible.

One module per job, re-exported here (what targets.py and the tests import):
mutate_bytes (boundary values, byte mutations), mutate_flatbuffer (FlatMap, mutate_field),
mutate_model (ModelMutator), mutate_etrecord (ETRecord JSON and zip, etlab's and upstream's),
mutate_pickle (upstream ETRecords' torch.save pickles).
"""

from __future__ import annotations

from tests.fuzz.mutate_bytes import BOUNDARY_FLOATS, BOUNDARY_INTS, MAX_INPUT, mutate_bytes
from tests.fuzz.mutate_etrecord import EtrecordMutator, UpstreamEtrecordMutator, mutate_zip_header
from tests.fuzz.mutate_flatbuffer import Field, FlatMap, mutate_field
from tests.fuzz.mutate_model import ModelMutator
from tests.fuzz.mutate_pickle import replace_torch_pickle, shared_reference_pickle, torch_pickle

__all__ = ["BOUNDARY_FLOATS", "BOUNDARY_INTS", "MAX_INPUT", "EtrecordMutator", "Field", "FlatMap", "ModelMutator",
           "UpstreamEtrecordMutator", "mutate_bytes", "mutate_field", "mutate_zip_header", "replace_torch_pickle",
           "shared_reference_pickle", "torch_pickle"]
