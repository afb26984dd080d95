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
