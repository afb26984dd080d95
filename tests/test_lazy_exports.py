"""etlab.devtools (`_WHERE`, `_LOWER`) and etlab.compiler (`_QUANTIZER`) load names lazily and list the same
names under `if TYPE_CHECKING:` for pyright (`make lint`): the lists must agree, or a checker sees a name the
package cannot load, or a lazily loaded name is typed as a module (or Any)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import etlab.devtools as devtools


def _type_checking_imports(path: Path) -> dict[str, str]:
    """name -> module, from the imports in the module's `if TYPE_CHECKING:` blocks."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    out.update({a.asname or a.name: imp.module or "" for a in imp.names})
    return out


def test_devtools_type_checking_imports_match_lazy_exports():
    seen = _type_checking_imports(Path(devtools.__file__))
    expected = {name: f"etlab.devtools.{mod}" for name, mod in devtools._WHERE.items()}
    expected.update(devtools._LOWER)
    expected["inspector"] = "etlab"
    assert seen == expected
    assert set(devtools.__all__) == set(expected) | {"bundled_program"}


def test_devtools_lazy_names_load_from_where_the_checker_looks():
    for name, mod in devtools._WHERE.items():
        assert getattr(devtools, name) is getattr(importlib.import_module(f"etlab.devtools.{mod}"), name), name


def test_compiler_type_checking_imports_match_lazy_quantizer_names():
    import etlab.compiler as compiler

    seen = _type_checking_imports(Path(compiler.__file__))
    assert seen == {name: "etlab.compiler._quantizer" for name in compiler._QUANTIZER}
    assert set(compiler._QUANTIZER) <= set(compiler.__all__)
