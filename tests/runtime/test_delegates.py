"""DelegateCall through the backend interface: init/execute/destroy, errors, and the trace context."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import (
    DebugLevel,
    LoadError,
    NullDelegateContext,
    Runtime,
    register_backend,
    unregister_backend,
)
from etlab.schema import deserialize_etdump
from tests.runtime._programs import ScaleBackend, delegate_program


@pytest.fixture
def backend():
    be = ScaleBackend()
    register_backend("ScaleBackend", be)
    yield be
    unregister_backend("ScaleBackend")


@pytest.mark.parametrize("in_segment", [False, True])
def test_delegate_runs_through_the_backend(backend, in_segment):
    rt = Runtime.get()
    assert "ScaleBackend" in rt.backend_registry.registered_backend_names
    assert rt.backend_registry.is_available("ScaleBackend")
    program = rt.load_program(delegate_program(factor=3, in_segment=in_segment))
    method = program.load_method("forward")
    assert backend.inits == [(bytes([3]), [("mode", b"fast")])]
    x = torch.arange(4.0).reshape(2, 2)
    torch.testing.assert_close(method.execute([x])[0], 3 * x)
    assert isinstance(backend.contexts[-1], NullDelegateContext)  # tracing off: no-op context
    method.close()
    assert backend.destroyed == [{"factor": 3}]
    method.close()
    assert len(backend.destroyed) == 1


def test_unknown_or_unavailable_backend_fails_at_load(backend):
    rt = Runtime.get()
    with pytest.raises(LoadError, match="needs backend 'NoSuchBackend', which is not registered"):
        rt.load_program(delegate_program("NoSuchBackend")).load_method("forward")
    backend.available = False
    with pytest.raises(LoadError, match="needs backend 'ScaleBackend', which is not available"):
        rt.load_program(delegate_program()).load_method("forward")


def test_register_backend_checks_the_interface():
    with pytest.raises(TypeError, match=r"no callable init\(\)"):
        register_backend("Broken", object())


def test_delegate_events_in_the_trace(backend, tmp_path):
    rt = Runtime.get()
    program = rt.load_program(delegate_program(factor=2), enable_etdump=True, debug_buffer_size=4096,
                              etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    method = program.load_method("forward")
    x = torch.ones(2, 2)
    method.execute([x])
    program.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")
    run = deserialize_etdump((tmp_path / "d.etdp").read_bytes()).run_data[1]
    profile = [e.profile_event for e in run.events if e.profile_event]
    debug = [e.debug_event for e in run.events if e.debug_event]
    start_end = profile[0]
    assert (start_end.name, start_end.delegate_debug_id_str, start_end.delegate_debug_id_int) == (None, "scale_op", -1)
    assert bytes(start_end.delegate_debug_metadata) == b"meta-bytes"
    assert start_end.end_time >= start_end.start_time
    posthoc = profile[1]
    assert (posthoc.delegate_debug_id_int, posthoc.start_time, posthoc.end_time) == (7, 1000, 2000)
    assert bytes(posthoc.delegate_debug_metadata) == b"posthoc"
    assert [p.name for p in profile[2:]] == ["DELEGATE_CALL", "Method::execute"]
    assert all((p.chain_index, p.instruction_id) == (0, 0) for p in profile[:3])
    # The delegate's own output log, every argument of the call (inputs, outputs), the program output.
    assert [d.delegate_debug_id_int for d in debug] == [7, -1, -1, -1]
    assert [d.debug_entry.output is not None for d in debug] == [False, False, False, True]
    buf = (tmp_path / "d.bin").read_bytes()
    t = debug[0].debug_entry.tensor
    logged = torch.frombuffer(bytearray(buf[t.offset : t.offset + 16]), dtype=torch.float32).reshape(2, 2)
    torch.testing.assert_close(logged, 2 * x)


def test_delegate_event_identifiers_are_checked(backend):
    rt = Runtime.get()
    program = rt.load_program(delegate_program(), enable_etdump=True)
    method = program.load_method("forward")
    method.execute([torch.ones(2, 2)])
    context = backend.contexts[-1]
    with pytest.raises(ValueError, match="exactly one identifier"):
        context.start_profiling_delegate()
    with pytest.raises(ValueError, match="exactly one identifier"):
        context.log_profiling_delegate("name", 3, 0, 1)
    context.start_profiling_delegate(delegate_debug_id="string-id")  # a string id counts as the name
