"""A `BundledProgram` to a .bpte (FlatBuffer) and back (upstream's `bundled_program.serialize`).

`deserialize_from_flatbuffer_to_bundled_program` returns the schema model
(`etlab.schema.bundled_program.BundledProgram`), as upstream returns its schema's; verified on read.
"""

from etlab.devtools._bundled_program import (
    deserialize_from_flatbuffer_to_bundled_program,
    serialize_from_bundled_program_to_flatbuffer,
)

__all__ = ["deserialize_from_flatbuffer_to_bundled_program", "serialize_from_bundled_program_to_flatbuffer"]
