"""gc_pause.paused: no collection inside, the collector as it was afterwards."""

from __future__ import annotations

import gc

import pytest

from mallard import gc_pause


def test_paused_disables_collection_and_restores_it() -> None:
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_pause.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()  # restored on an error too


def test_paused_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
