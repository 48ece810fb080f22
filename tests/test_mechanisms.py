"""One list of mechanism names: the trainer's --disable, the suite schema and the docs read
the same names, and each name switches something off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.mechanisms import LAUNCHER_MECHANISMS, MECHANISMS, OPT_IN, TRAINER_MECHANISMS
from harness.suites.scenario import TrainerSpec
from reference_trainer.cli import build_parser
from reference_trainer.config import preset
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.registry import REGISTRY, disable, fragile, mechanism_states

DOCS = Path(__file__).resolve().parent.parent / "docs" / "stability.md"


def test_the_trainer_accepts_exactly_the_trainer_mechanisms() -> None:
    (action,) = [a for a in build_parser()._actions if "--disable" in a.option_strings]
    assert set(action.choices or ()) == set(TRAINER_MECHANISMS)


@pytest.mark.parametrize("name", sorted(TRAINER_MECHANISMS))
def test_each_name_switches_something_off(name: str) -> None:
    config = StabilityConfig()
    before = repr(config)
    disable(config, name)
    assert repr(config) != before, f"--disable {name} changed nothing"


def test_an_unknown_name_is_refused_by_the_trainer_and_the_suite() -> None:
    with pytest.raises(KeyError):
        disable(StabilityConfig(), "seatbelt")
    with pytest.raises(ValueError, match="unknown mechanism"):
        TrainerSpec(disable=["seatbelt"])


def test_a_suite_may_name_every_mechanism() -> None:
    assert TrainerSpec(disable=list(MECHANISMS)).disable == list(MECHANISMS)


def test_the_registry_holds_every_mechanism_once_and_no_other() -> None:
    names = [entry.name for entry in REGISTRY]
    assert len(names) == len(set(names))
    assert {e.name for e in REGISTRY if not e.opt_in} == set(TRAINER_MECHANISMS)
    assert {e.name for e in REGISTRY if e.opt_in} == set(OPT_IN) - DATA_OPT_IN
    hooks = [entry.hooks for entry in REGISTRY if entry.hooks is not None]
    assert [h.name for h in hooks] == [e.name for e in REGISTRY if e.hooks is not None]


def test_fragile_switches_off_every_mechanism_but_background_saves() -> None:
    config = fragile()
    for name in set(TRAINER_MECHANISMS) - {"async"}:
        before = repr(config)
        disable(config, name)
        assert repr(config) == before, f"--fragile left {name} on"
    assert config.checkpoints.asynchronous


def test_a_checkpoint_keeps_the_same_mechanism_keys_in_the_same_order() -> None:
    # Checkpoints written before the registry hold these keys in this order; a mechanism
    # that is off saves {} under its keys, so every checkpoint has them all.
    keys = ["monitor", "layers", "surgery", "adaptive_warmup", "quality", "hard_samples", "rl_lr"]
    assert list(mechanism_states([])) == keys
    assert all(state == {} for state in mechanism_states([]).values())


def test_the_docs_describe_every_mechanism_and_no_other() -> None:
    text = DOCS.read_text()
    rows = re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE)
    assert rows == list(TRAINER_MECHANISMS)
    for name in LAUNCHER_MECHANISMS:
        assert f"disable: [{name}]" in text


def test_the_trainer_and_the_suite_accept_exactly_the_opt_ins() -> None:
    (action,) = [a for a in build_parser()._actions if "--enable" in a.option_strings]
    assert set(action.choices or ()) == set(OPT_IN)
    assert TrainerSpec(enable=list(OPT_IN)).enable == list(OPT_IN)
    with pytest.raises(ValueError, match="unknown opt-in"):
        TrainerSpec(enable=["seatbelt"])
    with pytest.raises(KeyError):
        StabilityConfig().enable("seatbelt")


#: Opt-ins of the data path, not of stability: `TrainConfig.enable` switches them.
DATA_OPT_IN = {"dynamic_batching"}
#: Opt-ins that act on a detector's claims or flags: under --fragile the detector is off, so
#: there is nothing to switch on.
_NEED_A_DETECTOR = {"forecast_acting", "straggler_rebalance"}


@pytest.mark.parametrize("name", sorted(set(OPT_IN) - DATA_OPT_IN))
def test_each_opt_in_switches_something_on_and_under_fragile_only_without_a_detector(
    name: str,
) -> None:
    config = StabilityConfig()
    before = repr(config)
    config.enable(name)
    assert repr(config) != before, f"--enable {name} changed nothing"
    all_off = fragile()
    before = repr(all_off)
    all_off.enable(name)
    assert (repr(all_off) == before) == (name in _NEED_A_DETECTOR)


@pytest.mark.parametrize("name", sorted(OPT_IN))
def test_the_trainer_config_switches_every_opt_in_on(name: str) -> None:
    config = preset("tiny")
    before = repr(config)
    config.enable(name)
    assert repr(config) != before, f"--enable {name} changed nothing"


@pytest.mark.parametrize("name", sorted(DATA_OPT_IN))
def test_a_data_opt_in_is_not_a_stability_mechanism(name: str) -> None:
    with pytest.raises(KeyError):
        StabilityConfig().enable(name)
    config = preset("tiny")
    config.stability = fragile()
    before = repr(config.stability)
    config.enable(name)  # the negative control still trains on what was asked
    assert repr(config.stability) == before and repr(config) != repr(preset("tiny"))
