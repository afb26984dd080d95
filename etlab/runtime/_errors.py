"""Errors raised by the etlab runtime."""


class LoadError(RuntimeError):
    """A program or method cannot be loaded: a missing kernel or backend, a broken memory plan, bad arguments.

    The message names the method, the instruction and the operator or value at fault.
    """


class ExecutionError(RuntimeError):
    """A method cannot run with the given inputs, or a kernel failed while running.

    Raised before anything runs for input mismatches (count, kind, dtype, rank, shape), so the
    method stays usable; the message gives the expected and the actual value.
    """
