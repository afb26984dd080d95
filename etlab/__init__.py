"""etlab: the ExecuTorch compile-and-run stack in Python, with notebook-first developer tools."""

from etlab.errors import Error, FormatError

__version__ = "0.1.0"
__all__ = ["Error", "FormatError", "__version__"]
