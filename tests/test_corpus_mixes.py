"""Named data mixes and the two sources of the `llama` mix (web pages, encyclopedia
articles): shares measured over many documents, style, the ``--data-mix`` flag and a
suite's ``trainer.data_mix``."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest

from harness.data_mixes import DATA_MIXES as SUITE_MIXES
from harness.running.launch import reference_command
from harness.suites.scenario import TrainerSpec
from harness.suites.suite_loader import ScenarioError, load_suite
from reference_trainer.cli import build_parser, settle_config
from reference_trainer.config import DataConfig, preset
from reference_trainer.corpus.corpus import SOURCE_NAMES, Corpus, generate_text
from reference_trainer.corpus.mixes import DATA_MIXES, mix_weights
from reference_trainer.errors import ConfigError

SEED = 1234


def test_every_mix_names_known_sources_and_the_default_mix_is_the_config_default() -> None:
    for weights in DATA_MIXES.values():
        assert set(weights) <= set(SOURCE_NAMES)
        assert abs(sum(weights.values()) - 1.0) < 1e-12
    assert DataConfig().source_weights == mix_weights("default")
    # The default mix never draws the sources added for the llama mix.
    assert not {"web", "encyclopedia"} & set(DataConfig().source_weights)


def test_llama_mix_shares_measured_over_many_documents() -> None:
    n = 3000
    counts = Counter(d.source for d in islice(Corpus(mix_weights("llama"), SEED).documents(), n))
    assert set(counts) == {"web", "encyclopedia", "code"}
    for source, share in (("web", 0.60), ("encyclopedia", 0.15), ("code", 0.25)):
        # 3000 draws: one standard error is at most 0.009, so 0.03 is over three of them.
        assert abs(counts[source] / n - share) < 0.03, (source, counts[source] / n)


def test_style_markers_of_web_pages_and_encyclopedia_articles() -> None:
    pages = [generate_text("web", SEED, i) for i in range(50)]
    for page in pages:
        lines = page.splitlines()
        assert lines[0].startswith("Home > ") and lines[0].count(" > ") == 2  # crumbs
        assert "\n# " in page and "min read" in page and "All rights reserved." in page
    assert sum("\n## " in p for p in pages) >= 45
    assert sum("\n- " in p for p in pages) >= 25  # bullet lists in many pages
    articles = [generate_text("encyclopedia", SEED, i) for i in range(50)]
    for article in articles:
        title, blank, lead = article.splitlines()[:3]
        assert blank == "" and lead.startswith(title)  # the first sentence defines it
        assert "== See also ==" in article and any(c.isdigit() for c in lead + article)
    assert sum("== History ==" in a or "== Description ==" in a for a in articles) >= 15


def test_web_and_encyclopedia_lengths_stay_in_their_range() -> None:
    for source, lo, hi in (("web", 80, 700), ("encyclopedia", 80, 900)):
        sizes = [len(generate_text(source, SEED, i).split()) for i in range(200)]
        assert all(lo <= s <= hi for s in sizes), (source, min(sizes), max(sizes))


def _settle(*argv: str) -> object:
    return settle_config(build_parser().parse_args(list(argv)))


def test_data_mix_flag_sets_the_weights_and_the_default_is_unchanged(tmp_path: Path) -> None:
    cfg = _settle("--run-dir", str(tmp_path), "--data-mix", "llama")
    assert cfg.data.source_weights == {"web": 0.60, "encyclopedia": 0.15, "code": 0.25}  # type: ignore[attr-defined]
    plain = _settle("--run-dir", str(tmp_path))
    assert plain.data.source_weights == preset("tiny").data.source_weights  # type: ignore[attr-defined]


def test_unknown_mix_is_refused_naming_the_choices(tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--run-dir", str(tmp_path), "--data-mix", "pile"])
    assert exit_info.value.code == 2
    assert "--data-mix" in err.getvalue() and "llama" in err.getvalue()
    with pytest.raises(ValueError, match=r"unknown data mix 'pile'.*llama"):
        mix_weights("pile")


def test_a_resumed_run_refuses_another_mix(tmp_path: Path) -> None:
    cfg = preset("tiny")
    cfg.data.source_weights = mix_weights("llama")
    cfg.save(tmp_path)
    assert _settle("--run-dir", str(tmp_path), "--resume", "--data-mix", "llama") == cfg
    with pytest.raises(ConfigError, match="--data-mix default differs"):
        _settle("--run-dir", str(tmp_path), "--resume", "--data-mix", "default")


def test_the_suite_and_the_trainer_know_the_same_mixes() -> None:
    assert set(SUITE_MIXES) == set(DATA_MIXES)
    (action,) = [a for a in build_parser()._actions if "--data-mix" in a.option_strings]
    assert set(action.choices or ()) == set(DATA_MIXES)


def test_a_suite_names_a_mix_and_the_trainer_gets_it(tmp_path: Path) -> None:
    spec = TrainerSpec(data_mix="llama", enable=["quality_sampling"])
    argv = reference_command(spec, tmp_path, None)
    assert argv[argv.index("--data-mix") + 1] == "llama"
    assert "--data-mix" not in reference_command(TrainerSpec(), tmp_path, None)
    assert "--data-mix" not in reference_command(spec, tmp_path, None, resume=True)
    # The mix is part of what the run computes: another mix, another baseline.
    assert TrainerSpec(data_mix="llama").identity() != TrainerSpec().identity()


def test_a_suite_with_an_unknown_mix_is_refused_by_its_dotted_path(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(
        "suite: mixes\nscenarios:\n  - name: pile\n    trainer: {data_mix: pile}\n"
        "    faults: []\n    expect: {completed: true}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        load_suite(path)
    (problem,) = caught.value.problems
    assert "trainer.data_mix" in problem and "pile" in problem and "llama" in problem
    with pytest.raises(ValueError, match="data_mix applies to the reference trainer"):
        TrainerSpec(data_mix="llama", command="python train.py")
