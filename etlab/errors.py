"""Errors shared by every etlab layer."""


class FormatError(ValueError):
    """A file or buffer is not a valid etlab/ExecuTorch file; the message names it and the defect."""
