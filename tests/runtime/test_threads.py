"""One Program shared by threads, each thread with its own Methods; a Method refuses a second thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from etlab.runtime import ExecutionError, Runtime, register_kernel, unregister_kernel
from tests.runtime._programs import PlanBuilder, ProgramBuilder, accumulator_program, add_chain


def test_methods_of_one_program_run_in_threads():
    rt = Runtime.get()
    chain, w = add_chain(20, shape=(16, 16))
    chain_program = rt.load_program(chain, enable_etdump=True)
    acc_program = rt.load_program(accumulator_program(None))

    def work(seed: int):
        g = torch.Generator().manual_seed(seed)
        method = chain_program.load_method("forward")
        acc = acc_program.load_method("forward")
        total = torch.zeros(3)
        for _ in range(25):
            x = torch.randn(16, 16, generator=g)
            torch.testing.assert_close(method.execute([x])[0], x + 20 * w, rtol=1e-5, atol=1e-5)
            step = torch.randn(3, generator=g)
            total += step
            torch.testing.assert_close(acc.execute([step])[0], total, rtol=1e-5, atol=1e-5)
        return seed

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(work, range(8))) == list(range(8))
    # Every run of every thread landed in the shared trace.
    assert len(chain_program._tracer.to_etdump().run_data) == 1 + 8 * 25


def test_a_method_serves_one_thread_at_a_time():
    entered, release = threading.Event(), threading.Event()

    def blocking(x, out, _ret):
        entered.set()
        release.wait(10)
        out.copy_(x)

    register_kernel("etlab_test::block.out", blocking)
    try:
        b = PlanBuilder()
        x = b.tensor([2])
        out = b.tensor([2])
        b.kernel("etlab_test::block.out", x, out, out)
        method = Runtime.get().load_program(ProgramBuilder().serialize([b.plan([x], [out])])).load_method("forward")
        worker = threading.Thread(target=method.execute, args=([torch.ones(2)],))
        worker.start()
        assert entered.wait(10)
        with pytest.raises(ExecutionError, match="already running in another thread"):
            method.execute([torch.ones(2)])
        release.set()
        worker.join(10)
        torch.testing.assert_close(method.execute([torch.full((2,), 5.0)])[0], torch.full((2,), 5.0))
    finally:
        release.set()
        unregister_kernel("etlab_test::block.out")


def _thread_probe_program(seen: list[int]) -> bytes:
    """A program whose one kernel records how many intra-op threads torch would use while it runs."""

    def probe(x, out, _ret):
        seen.append(torch.get_num_threads())
        out.copy_(x)

    register_kernel("etlab_test::threads_probe.out", probe)
    b = PlanBuilder()
    x = b.tensor([2])
    out = b.tensor([2])
    b.kernel("etlab_test::threads_probe.out", x, out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


@pytest.mark.parametrize("threads, expected", [("default", 1), (2, 2), (None, "torch")])
def test_kernels_run_with_the_programs_threads_and_torch_keeps_its_own(threads, expected, tmp_path):
    from etlab.schema import etdump as E

    seen: list[int] = []
    before = torch.get_num_threads()
    outside = 3 if before != 3 else 4  # differs from every setting asked for above
    try:
        pte = _thread_probe_program(seen)
        kwargs = {} if threads == "default" else {"threads": threads}
        torch.set_num_threads(outside)
        program = Runtime.get().load_program(pte, enable_etdump=True, **kwargs)
        method = program.load_method("forward")
        assert method.threads == program.threads == (1 if threads == "default" else threads)
        for _ in range(2):
            torch.testing.assert_close(method.execute([torch.ones(2)])[0], torch.ones(2))
            assert torch.get_num_threads() == outside  # restored after each execute
        want = outside if expected == "torch" else expected
        assert seen == [want, want]
        path = tmp_path / "run.etdp"
        program.write_etdump_result_to_file(path)
        blocks = E.deserialize_etdump(path.read_bytes()).run_data
        recorded = 0 if expected == "torch" else want  # torch's own setting: not recorded
        assert [(b.name, b.threads) for b in blocks] == [("Default", 0), ("Execute", recorded), ("Execute", recorded)]
    finally:
        torch.set_num_threads(before)
        unregister_kernel("etlab_test::threads_probe.out")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="threads must be a positive int"):
        Runtime.get().load_program(add_chain(1)[0], threads=bad)


def test_a_failing_run_restores_torchs_threads():
    before = torch.get_num_threads()
    method = Runtime.get().load_program(add_chain(1, shape=(2, 3))[0], threads=1).load_method("forward")
    torch.set_num_threads(2 if before == 1 else before)
    outside = torch.get_num_threads()
    try:
        with pytest.raises(ExecutionError):
            method.execute([torch.ones(5)])
        assert torch.get_num_threads() == outside
    finally:
        torch.set_num_threads(before)
