"""Choosing the optimizer and its settings: the trainer's flags, a suite's
``trainer.optimizer``, and the command line between them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.optimizers import OPTIMIZERS
from harness.running.launch import reference_command
from harness.suites.scenario import TrainerSpec
from reference_trainer.cli import build_parser, settle_config
from reference_trainer.config import TrainConfig, preset
from reference_trainer.errors import ConfigError


def _settle(*argv: str) -> TrainConfig:
    return settle_config(build_parser().parse_args(list(argv)))


def test_flags_set_the_optimizer_and_leave_the_rest_of_the_preset(tmp_path: Path) -> None:
    cfg = _settle("--run-dir", str(tmp_path), "--beta2", "0.98", "--lr", "0.002")
    assert (cfg.optim.name, cfg.optim.beta2, cfg.optim.base_lr) == ("adamw", 0.98, 0.002)
    plain = preset("tiny").optim
    assert (cfg.optim.beta1, cfg.optim.warmup_steps) == (plain.beta1, plain.warmup_steps)
    assert _settle("--run-dir", str(tmp_path)).optim == plain


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [("--beta2", "1.0", "in [0, 1)"), ("--lr", "0", "positive"), ("--optimizer", "sgd", "sgd")],
)
def test_bad_optimizer_flags_are_refused_by_name(
    tmp_path: Path, flag: str, value: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--run-dir", str(tmp_path), flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and expected in err


def test_a_resumed_run_refuses_other_optimizer_settings(tmp_path: Path) -> None:
    cfg = _settle("--run-dir", str(tmp_path), "--beta2", "0.98")
    cfg.save(tmp_path)
    assert _settle("--run-dir", str(tmp_path), "--resume", "--beta2", "0.98") == cfg
    with pytest.raises(ConfigError, match=r"--beta2 0\.999 differs from the resumed run.s 0\.98"):
        _settle("--run-dir", str(tmp_path), "--resume", "--beta2", "0.999")


def test_a_config_written_before_the_choice_loads_as_adamw(tmp_path: Path) -> None:
    data = preset("tiny").to_dict()
    del data["optim"]["name"]
    assert TrainConfig.from_dict(data).optim.name == "adamw"
    data["optim"]["name"] = "lion"
    with pytest.raises(ConfigError, match=r"optim\.name must be one of adamw"):
        TrainConfig.from_dict(data)


def test_a_suite_optimizer_reaches_the_trainer_command(tmp_path: Path) -> None:
    spec = TrainerSpec(optimizer={"name": "adamw", "beta2": 0.98})  # type: ignore[arg-type]
    argv = reference_command(spec, tmp_path, None)
    i = argv.index("--optimizer")
    assert argv[i : i + 4] == ["--optimizer", "adamw", "--beta2", "0.98"]
    parsed = build_parser().parse_args(argv[argv.index("--run-dir") :])
    assert settle_config(parsed).optim.beta2 == 0.98
    assert "--optimizer" not in reference_command(TrainerSpec(), tmp_path, None)


def test_a_bare_name_is_an_optimizer_and_unknown_names_are_refused() -> None:
    assert TrainerSpec(optimizer="adamw").optimizer.name == "adamw"  # type: ignore[arg-type,union-attr]
    with pytest.raises(ValidationError, match="unknown optimizer lion; expected some of adamw"):
        TrainerSpec(optimizer="lion")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="optimizer applies to the reference trainer"):
        TrainerSpec(command="python train.py", optimizer="adamw")  # type: ignore[arg-type]


def test_choosing_an_optimizer_changes_the_run_identity_and_none_keeps_old_keys() -> None:
    plain, chosen = TrainerSpec(), TrainerSpec(optimizer={"beta2": 0.98})  # type: ignore[arg-type]
    assert "optimizer" not in plain.identity()
    assert chosen.identity()["optimizer"]["beta2"] == 0.98


def test_the_trainer_offers_every_optimizer_the_harness_knows() -> None:
    (action,) = [a for a in build_parser()._actions if "--optimizer" in a.option_strings]
    assert set(action.choices or ()) == set(OPTIMIZERS)
