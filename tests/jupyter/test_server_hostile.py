"""A hostile or huge file cannot stall the Lab server (issue 24, item 2).

The server's readers run in worker processes with a time budget per request (ETLAB_LAB_TIMEOUT_S,
set low here) and a memory budget. On a real server started as `make lab` starts it: while one or
two requests that outlast the budget are in flight, another viewer's request is answered; the
slow ones end in a clear error naming the file; the server and its viewers keep working. The
issue's own file (an upstream ETRecord whose pickle shares lists 2**60 ways) answers its
FormatError. Timing is asserted as ordering (the good request finishes while the slow ones are
still pending), never as a wall-clock bound.
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from tests.jupyter.conftest import MakeLab
from tests.runtime._programs import add_chain
from tests.security._craft import shared_list_pickle, small_etrecord, torch_member, upstream_etrecord_with

pytestmark = [pytest.mark.xdist_group("jupyter"), pytest.mark.slow]

BUDGET_S = 6  # per request, on this test's server; the slow program takes several times longer
SLOW_CHAIN = 30_000  # instructions: its view takes well over BUDGET_S (about 1 ms each, to read and lay out)


class BudgetedLab(MakeLab):
    """`make lab`'s server with the per-request time budget set in its environment, as a user would."""

    def command(self):
        cmd, env = super().command()
        return cmd, {**env, "ETLAB_LAB_TIMEOUT_S": str(BUDGET_S), "ETLAB_LAB_WORKERS": "2"}


@pytest.fixture(scope="module")
def hostile_lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "good.pte").write_bytes(add_chain(3)[0])
    slow = add_chain(SLOW_CHAIN)[0]
    for i in range(1, 5):  # one per test (a read stopped once is refused at once the next time)
        (root / f"slow_{i}.pte").write_bytes(slow)
    run = small_etrecord(tmp_path_factory.mktemp("run") / "mlp.etrecord")
    upstream_etrecord_with(run, root / "shared.etrecord",
                           {"representative_inputs": torch_member(shared_list_pickle(60))})
    shutil.copy(run.parent / "run.etdp", root / "run.etdp")
    with BudgetedLab(root=root, base=tmp_path_factory.mktemp("hostilebase"), lifetime_s=600) as server:
        _until_ok(server, "etlab/api/view/pte?path=good.pte")  # the readers are imported
        yield server
        assert server.alive(), "the server went down"


def _until_ok(server, path: str, tries: int = 30) -> dict:
    for _ in range(tries):
        status, body = server.get_json(path)
        if status == 200:
            return body
        time.sleep(1)
    raise AssertionError(f"{path}: {status} {body}")


class _InFlight(threading.Thread):
    """A request run in the background: its status and body once it ends."""

    def __init__(self, server, path: str):
        super().__init__(daemon=True)
        self.server, self.path, self.result = server, path, None

    def run(self):
        self.result = self.server.get_json(self.path)


def _start(server, *paths: str) -> list[_InFlight]:
    requests = [_InFlight(server, p) for p in paths]
    for r in requests:
        r.start()
    time.sleep(0.5)  # they reach the server (the assertions below hold whatever this wait is)
    return requests


@pytest.mark.parametrize("hostile", [("slow_1.pte",), ("slow_2.pte", "slow_3.pte")], ids=["one", "two"])
def test_a_viewer_is_answered_while_slow_requests_are_in_flight(hostile_lab, hostile):
    slow = _start(hostile_lab, *(f"etlab/api/view/pte?path={name}" for name in hostile))
    status, good = hostile_lab.get_json("etlab/api/view/pte?path=good.pte")
    still_pending = [r.is_alive() for r in slow]
    assert status == 200 and good["methods"][0]["name"] == "forward"
    assert all(still_pending), "a slow request ended before the good one was answered: the test proves nothing"
    for r, name in zip(slow, hostile):
        r.join(timeout=300)
        assert not r.is_alive(), f"{name}: no answer"
        status, body = r.result
        assert status == 422, (status, body)
        assert body["error"] == (f"{name}: reading it took more than {BUDGET_S} s; the server stopped it (the time "
                                 "budget per request is ETLAB_LAB_TIMEOUT_S)")
    assert hostile_lab.get_json("etlab/api/view/pte?path=good.pte")[0] == 200  # the pool recovered
    assert hostile_lab.get_json("etlab/api/stat?path=slow_1.pte")[0] == 200


def test_requests_about_one_slow_file_hold_one_worker(hostile_lab):
    """Five viewers of the same slow file queue behind each other (the first is stopped, the others
    get its answer without reading the file again); other files are still answered meanwhile."""
    slow = _start(hostile_lab, *["etlab/api/view/pte?path=slow_4.pte"] * 5)
    for _ in range(3):
        status, _ = hostile_lab.get_json("etlab/api/view/pte?path=good.pte")
        assert status == 200
    assert any(r.is_alive() for r in slow)
    for r in slow:
        r.join(timeout=600)
        assert r.result[0] == 422 and "slow_4.pte: reading it took more than" in r.result[1]["error"]
    (hostile_lab.root / "slow_4.pte").write_bytes(add_chain(3)[0])  # fixed: read again, and answered
    assert hostile_lab.get_json("etlab/api/view/pte?path=slow_4.pte")[0] == 200


def test_the_issue_shared_pickle_etrecord_answers_a_clear_error(hostile_lab):
    status, body = hostile_lab.get_json("etlab/api/view/etrecord?path=shared.etrecord")
    assert status == 422, body
    assert body["error"].startswith("shared.etrecord: entry 'representative_inputs': the value has more than")
    assert str(hostile_lab.root) not in body["error"]  # named relative to the root
    status, run = hostile_lab.get_json("etlab/api/view/etdp?path=run.etdp&program=shared.etrecord")
    assert status == 422 and run["error"].startswith("shared.etrecord: entry 'representative_inputs'"), run
    assert hostile_lab.get_json("etlab/api/view/pte?path=good.pte")[0] == 200


def test_a_reader_process_cannot_take_more_memory_than_its_budget(tmp_path):
    """The workers' address space is capped (ETLAB_LAB_MEMORY_MB above their size after import): a
    file that needs more (a 300 MiB program is mapped whole) is refused naming the file, and the
    next request is served."""
    import asyncio

    from etlab.jupyter._pool import Budget, WorkerPool

    (tmp_path / "good.pte").write_bytes(add_chain(3)[0])
    with open(tmp_path / "big.pte", "wb") as f:
        f.write(b"\0\0\0\0ET12")
        f.truncate(300 << 20)

    async def both():
        pool = WorkerPool(tmp_path, Budget(seconds=300, memory_mb=64, workers=1, max_workers=2))
        try:
            return [await pool.call("pte", name, None, name=name) for name in ("big.pte", "good.pte")]
        finally:
            pool.close()

    (big_ok, big), (good_ok, _) = asyncio.run(both())
    assert not big_ok and big.startswith(b'{"kind": "format", "message": "big.pte: ') and b"memory" in big, big
    assert good_ok
