"""Errors raised by the etlab runtime."""

from etlab.errors import Error


class LoadError(Error, RuntimeError):
    """A program or method cannot be loaded: a missing kernel or backend, a broken memory plan, bad arguments.

    The message names the method, the instruction and the operator or value at fault.
    """


class ExecutionError(Error, RuntimeError):
    """A method cannot run with the given inputs, or a kernel failed while running.

    Raised before anything runs for input mismatches (count, kind, dtype, rank, shape), so the
    method stays usable; the message gives the expected and the actual value.
    """


def check_delegate_args(backend_id: str, n_inputs: int, n_outputs: int, args: list) -> None:
    """A backend's `execute` gets the delegate call's inputs then its preallocated outputs: a
    different count means the program's delegate call does not match the processed blob."""
    if len(args) != n_inputs + n_outputs:
        raise ExecutionError(f"{backend_id}: expected {n_inputs} inputs and {n_outputs} outputs "
                             f"({n_inputs + n_outputs} values), got {len(args)}")
