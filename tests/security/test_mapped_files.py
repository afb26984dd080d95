"""A memory-mapped file truncated while in use gives a FormatError, never SIGBUS.

Files above etlab.schema._files.SMALL_FILE_BYTES stay memory-mapped; the subprocess lowers that
threshold to 0 so a small test file takes the mapped path. A control run with the check switched
off shows the hazard is real (the child dies of SIGBUS), so the test would catch its removal.
"""

from __future__ import annotations

import signal

import torch

from tests.runtime._programs import add_chain
from tests.security._craft import run_isolated

_SCRIPT = """
import os, torch
import etlab.schema._files as files
files.SMALL_FILE_BYTES = 0
from etlab.runtime import Runtime
from etlab.errors import FormatError
if {disable_check}:
    files.GuardedMap.check_intact = lambda self: None
path = {path!r}
method = Runtime.get().load_program(path).load_method("forward")
x = torch.ones(256, 256)
method.execute([x])
os.truncate(path, 0)  # another process cuts the file short
try:
    method.execute([x])
    print("RAN")
except FormatError as e:
    print("REFUSED:", e)
if {debug_buffer!r}:  # the same for a debug buffer the Inspector reads tensors from
    from etlab.etdump._debug_buffer import load_debug_buffer, tensor_from_debug_buffer
    buffer = load_debug_buffer({debug_buffer!r})
    print("FIRST", float(tensor_from_debug_buffer(buffer, 6, [4], None, 0, "event 0").sum()))
    os.truncate({debug_buffer!r}, 0)
    try:
        tensor_from_debug_buffer(buffer, 6, [4], None, 65536, "event 1")
        print("RAN")
    except FormatError as e:
        print("REFUSED:", e)
"""


def _pte(tmp_path):
    data, _ = add_chain(n=2, shape=(256, 256))  # a 256 KiB constant segment
    path = tmp_path / "model.pte"
    path.write_bytes(data)
    return path


def test_truncated_mapped_program_and_debug_buffer_raise_format_error(tmp_path):
    path = _pte(tmp_path)
    buffer = tmp_path / "run.bin"
    buffer.write_bytes(torch.arange(65536, dtype=torch.float32).numpy().tobytes())
    proc = run_isolated(_SCRIPT.format(path=str(path), disable_check=False, debug_buffer=str(buffer)))
    assert proc.returncode == 0, f"crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"REFUSED: {path}: the file shrank from"), lines
    assert lines[1] == "FIRST 6.0" and lines[2].startswith(f"REFUSED: {buffer}: the file shrank from"), lines


def test_without_the_check_the_same_file_kills_the_process(tmp_path):
    proc = run_isolated(_SCRIPT.format(path=str(_pte(tmp_path)), disable_check=True, debug_buffer=""))
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-500:])


def test_small_files_are_read_into_memory(tmp_path):
    from etlab.schema import is_mapped, read_bytes

    path = _pte(tmp_path)
    view, _ = read_bytes(path)
    assert not is_mapped(view) and bytes(view[4:8]) == b"ET12"


def test_debug_buffers_past_one_mib_are_mapped_and_copy_on_write(tmp_path):
    """A runtime's debug buffer is mostly unused space: it is mapped, not read, from 1 MiB on; its
    tensors stay writable without touching the file, and a small one is still read into memory."""
    from etlab.etdump._debug_buffer import load_debug_buffer, tensor_from_debug_buffer
    from etlab.schema._files import is_mapped

    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(bytes(2 << 20))
    small.write_bytes(bytes(1 << 10))
    buf = load_debug_buffer(big)
    assert is_mapped(buf.data) and not is_mapped(load_debug_buffer(small).data)
    t = tensor_from_debug_buffer(buf, 6, [4], None, 64, "test")  # ScalarType.FLOAT
    t += 1
    assert t.tolist() == [1.0] * 4 and big.read_bytes() == bytes(2 << 20)
