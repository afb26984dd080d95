"""Upstream's module layout for bundled programs (`executorch.devtools.bundled_program`), so that its
documented imports work with the root changed to `etlab`:

    from etlab.devtools import BundledProgram
    from etlab.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from etlab.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

- `config`: `MethodTestCase`, `MethodTestSuite` and the value type aliases
- `core`: `BundledProgram`
- `serialize`: `serialize_from_bundled_program_to_flatbuffer`, `deserialize_from_flatbuffer_to_bundled_program`

The classes are etlab's (`etlab.devtools`); these modules only give them upstream's addresses.
"""
