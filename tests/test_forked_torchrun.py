"""A torchrun agent forked from a warm-start server names its rendezvous events' methods
as torch does, without building the stack (`harness.inside.forked_torchrun`). That warm
torchrun jobs leave what fresh ones leave is tests/test_warm_start.py's."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from harness.inside import forked_torchrun

TORCHS = dynamic_rendezvous.get_method_name


def _keep_alive(name: Callable[[int], str], depth: int) -> str:
    return _record(name, depth)


def _record(name: Callable[[int], str], depth: int) -> str:
    return name(depth)


def test_the_name_is_the_one_torch_finds_at_every_depth() -> None:
    """As torch's ``_record`` calls it (depth 2: the method that records), and at every
    other depth above the function itself, to past the bottom of the stack."""
    bottom = len(inspect.stack())
    for depth in [1, 2, 3, 4, bottom, bottom + 2, bottom + 3, 10_000]:
        ours = _keep_alive(forked_torchrun.method_name, depth)
        assert ours == _keep_alive(TORCHS, depth), depth
    assert _keep_alive(forked_torchrun.method_name, 2) == "_keep_alive"
    assert _keep_alive(forked_torchrun.method_name, 1) == "_record"
    assert _keep_alive(forked_torchrun.method_name, 10_000) == forked_torchrun.NO_NAME


def test_lighten_replaces_torchs_function_in_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", TORCHS)  # restored after
    forked_torchrun.lighten()
    assert dynamic_rendezvous.get_method_name is forked_torchrun.method_name
    # A torch without the function is left alone.
    monkeypatch.delattr(dynamic_rendezvous, "get_method_name")
    forked_torchrun.lighten()
    assert not hasattr(dynamic_rendezvous, "get_method_name")
