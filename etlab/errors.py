"""Errors shared by every etlab layer.

`Error` is the one root of the errors etlab raises on purpose (a bad file, a program that cannot load
or run, a model that cannot compile, a bundled test case that fails, a run paired with the wrong
program): `except etlab.Error` catches exactly those and lets a bug (a stray `KeyError`) through.
Each subclass keeps the builtin base it had before the root existed (`ValueError`, `RuntimeError`,
`AssertionError`), so callers that catch the builtin still work.

>>> import etlab
>>> issubclass(etlab.FormatError, etlab.Error) and issubclass(etlab.FormatError, ValueError)
True
>>> try:
...     raise FormatError("model.pte: bad magic")
... except Error as e:
...     print(type(e).__name__, e)
FormatError model.pte: bad magic
"""


class Error(Exception):
    """The root of etlab's own errors; every message names the file, method or argument at fault."""


class FormatError(Error, ValueError):
    """A file or buffer is not a valid etlab/ExecuTorch file; the message names it and the defect."""
