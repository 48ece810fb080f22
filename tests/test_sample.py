"""The sampler's bad input: one line on stderr, exit code 2, no file written; and the
harness's command lines for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.oracles.collapse import PhraseCollapseExpect
from harness.run_layout import RunLayout
from harness.running.launch import LaunchError
from harness.running.sampling import sample_command, take_samples
from harness.suites.scenario import Scenario, TrainerSpec
from reference_trainer.config import preset
from reference_trainer.sample import main
from reference_trainer.tokenizer.bpe import save_tokenizer, train_tokenizer


def _sample(run_dir: Path, out: Path, *extra: str) -> int:
    args = ["--run-dir", str(run_dir), "--k", "4", "--max-tokens", "8", "--out", str(out)]
    return main([*args, *extra])


def _run_without_checkpoints(run_dir: Path) -> None:
    """What a run leaves before its first save: its configuration and tokenizer."""
    run_dir.mkdir()
    cfg = preset("tiny")
    cfg.save(run_dir)
    texts = ["a small corpus of words", "to train a tokenizer on"] * 10
    save_tokenizer(train_tokenizer(texts, cfg.model.vocab_size), run_dir)


def test_a_missing_run_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "samples.json"
    assert _sample(tmp_path / "nowhere", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("does not exist") and "--run-dir" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_dir_without_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _sample(tmp_path, tmp_path / "samples.json") == 2
    assert "holds no run (no config.json)" in capsys.readouterr().err


def test_a_run_without_a_valid_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "samples.json"
    _run_without_checkpoints(run_dir)
    assert _sample(run_dir, out) == 2
    assert "no valid checkpoint" in capsys.readouterr().err
    # A damaged checkpoint is no better: the trainer's verified loader refuses it.
    damaged = RunLayout(run_dir).checkpoints / "step-00000010"
    damaged.mkdir(parents=True)
    (damaged / "manifest.json").write_text("{not json")
    assert _sample(run_dir, out) == 2
    err = capsys.readouterr().err
    assert "no valid checkpoint" in err and "step-00000010" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--k", "0"], "--k: expected 1 to 4096"), (["--max-tokens", "x"], "expected an integer")],
)
def test_bad_counts_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--run-dir", str(tmp_path), "--k", "4", "--max-tokens", "8", "--out", "o", *flags])
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_the_reference_trainer_samples_with_its_own_command(tmp_path: Path) -> None:
    asked = PhraseCollapseExpect(k=16, max_tokens=24, seed=5)
    argv = sample_command(TrainerSpec(), tmp_path, tmp_path / "s.json", asked)
    assert argv is not None and argv[:3] == [sys.executable, "-m", "reference_trainer.sample"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {
        "--run-dir": str(tmp_path),
        "--k": "16",
        "--max-tokens": "24",
        "--seed": "5",
        "--out": str(tmp_path / "s.json"),
    }
    topped = sample_command(
        TrainerSpec(), tmp_path, tmp_path / "s.json", asked.model_copy(update={"top_k": 10})
    )
    assert topped is not None and topped[-2:] == ["--top-k", "10"]


def test_a_command_trainer_samples_with_its_sample_command_or_not_at_all(tmp_path: Path) -> None:
    asked = PhraseCollapseExpect(k=8)
    plain = TrainerSpec(command="python train.py")
    assert sample_command(plain, tmp_path, tmp_path / "s.json", asked) is None
    spec = TrainerSpec(
        command="python train.py", sample_command="{python} gen.py {run_dir} -n {k} -o {out}"
    )
    argv = sample_command(spec, tmp_path, tmp_path / "s.json", asked)
    assert argv == [
        sys.executable,
        "gen.py",
        str(tmp_path.resolve()),
        "-n",
        "8",
        "-o",
        str((tmp_path / "s.json").resolve()),
    ]
    bad = TrainerSpec(command="python train.py", sample_command="gen {nosuch}")
    with pytest.raises(LaunchError, match="bad placeholder"):
        sample_command(bad, tmp_path, tmp_path / "s.json", asked)


def test_a_sample_command_needs_a_trainer_command() -> None:
    with pytest.raises(ValueError, match="sample_command must be a command line"):
        TrainerSpec(sample_command="python gen.py")


def test_take_samples_samples_the_run_and_its_baseline_into_the_run_dir(tmp_path: Path) -> None:
    run_dir, base_dir = tmp_path / "run", tmp_path / "base"
    run_dir.mkdir()
    base_dir.mkdir()
    gen = tmp_path / "gen.py"
    gen.write_text(
        "import json, sys\n"
        "run, k, top_k, out = sys.argv[1:]\n"
        "json.dump({'run': run, 'k': int(k), 'top_k': int(top_k)}, open(out, 'w'))\n"
    )
    layout = RunLayout(run_dir)
    layout.baseline_samples.write_text("stale")
    scenario = Scenario.model_validate(
        {
            "name": "s",
            "trainer": {
                "command": f"{sys.executable} {gen}",
                "sample_command": f"{{python}} {gen} {{run_dir}} {{k}} {{top_k}} {{out}}",
            },
            "expect": {"max_phrase_collapse": {"k": 3, "top_k": 5}},
        }
    )
    take_samples(scenario, run_dir, base_dir)
    assert json.loads(layout.samples.read_text()) == {
        "run": str(run_dir.resolve()),
        "k": 3,
        "top_k": 5,
    }
    assert json.loads(layout.baseline_samples.read_text())["run"] == str(base_dir.resolve())
    # Without a baseline, nothing stale is left to pass for its generations.
    take_samples(scenario, run_dir, None)
    assert layout.samples.is_file() and not layout.baseline_samples.exists()
