"""`specdec.serve.model_thread`: the server's model is loaded on a thread that ends, never the main one.

What it guards is speed (two live threads with OpenMP pools make every parallel region ~6x dearer:
the module's docstring), which no timed test here could check without flaking; so this checks the
mechanism: where `build` ran, that the thread is gone, and that its error reaches the caller.
"""

from __future__ import annotations

import threading

import pytest

from specdec.serve.model_thread import off_main_thread


def test_build_runs_on_a_thread_that_has_ended() -> None:
    ran_on = off_main_thread(threading.current_thread)
    assert ran_on is not threading.main_thread() and ran_on is not threading.current_thread()
    assert not ran_on.is_alive()


def test_an_error_in_build_reaches_the_caller() -> None:
    def build() -> None:
        raise FileNotFoundError("no model at /no/such/model")

    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        off_main_thread(build)
