"""The ExecuTorch 1.x file formats: typed models and (de)serializers.

- `.pte` program (`program`): `deserialize_pte`, `serialize_pte`, `load_pte`
- `.ptd` external data (`flat_tensor`): `deserialize_ptd`, `serialize_ptd`
- `.etdp` run trace (`etdump`): `deserialize_etdump`, `serialize_etdump`
- `.bpte` bundled program (`bundled_program`): `deserialize_bundled_program`, `serialize_bundled_program`
- an XNNPACK delegate's processed blob (`xnnpack`): `deserialize_xnnpack`, `serialize_xnnpack`

Every loader treats its input as untrusted and raises `etlab.FormatError` naming the defect.
"""

from etlab.errors import FormatError
from etlab.schema import bundled_program, etdump, flat_tensor, program, xnnpack
from etlab.schema._files import check_intact, is_mapped, map_file, read_bytes, write_atomic
from etlab.schema._generated.layouts import LAYOUTS
from etlab.schema._load_any import load_file
from etlab.schema.bundled_program import deserialize_bundled_program, serialize_bundled_program
from etlab.schema.etdump import deserialize_etdump, serialize_etdump
from etlab.schema.flat_tensor import PtdFile, deserialize_ptd, serialize_ptd
from etlab.schema.program import PteFile, deserialize_pte, load_pte, serialize_pte
from etlab.schema.scalar_type import ScalarType, dtype_to_scalar_type, scalar_type_to_dtype
from etlab.schema.xnnpack import deserialize_xnnpack, serialize_xnnpack

__all__ = [
    "LAYOUTS", "FormatError", "PtdFile", "PteFile", "ScalarType", "bundled_program", "check_intact",
    "deserialize_bundled_program", "deserialize_etdump", "deserialize_ptd", "deserialize_pte", "deserialize_xnnpack",
    "dtype_to_scalar_type", "etdump", "flat_tensor", "is_mapped", "load_file", "load_pte", "map_file", "program",
    "read_bytes", "scalar_type_to_dtype", "serialize_bundled_program", "serialize_etdump", "serialize_ptd",
    "serialize_pte", "serialize_xnnpack", "write_atomic", "xnnpack",
]
