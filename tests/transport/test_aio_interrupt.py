"""rig.transport.aio.run raises a Ctrl-C again when a loop callback swallowed it (uvloop reports a
KeyboardInterrupt raised in ``data_received`` as "Fatal error on transport" and goes on)."""

from __future__ import annotations

import pytest

from rig.cluster.signals import INTERRUPTED
from rig.transport import aio


@pytest.fixture(autouse=True)
def _clear():
    INTERRUPTED.clear()
    yield
    INTERRUPTED.clear()


async def _swallowed(then: BaseException | None = None) -> str:
    INTERRUPTED.set()  # what the CLI's handler sets before it raises; the loop swallowed the raise
    if then is not None:
        raise then
    return "done"


def test_a_swallowed_interrupt_is_raised_again_after_the_loop():
    with pytest.raises(KeyboardInterrupt, match="swallowed"):
        aio.run(_swallowed())


def test_a_swallowed_interrupt_wins_over_the_error_it_caused():
    with pytest.raises(KeyboardInterrupt) as e:
        aio.run(_swallowed(ConnectionResetError("transport closed")))
    assert isinstance(e.value.__cause__, ConnectionResetError)


def test_runs_without_a_signal_and_teardown_after_one_are_left_alone():
    async def plain() -> int:
        return 7
    assert aio.run(plain()) == 7
    INTERRUPTED.set()  # teardown after a delivered Ctrl-C: its loops must still run
    assert aio.run(plain()) == 7
    with pytest.raises(ValueError):
        aio.run(_swallowed(ValueError("its own error")))
