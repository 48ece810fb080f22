"""Did contamination collapse what the model says? The share of its generations that
hold the contamination's phrase, against the fault-free baseline's.

Evidence, not claims. The phrase is the fault's own parameter (``phrase`` of a
``duplicate_contamination`` fault in the plan the runner wrote, ``RUN_DIR/plan.yaml``).
The generations were written by the trainer's sampler (``samples.json`` and
``baseline-samples.json`` in the run dir), so they count only when they name the weights
they came from and those are the run's last checkpoint, as its own journal recorded it at
save time: the ``manifest_sha256`` of the last ``checkpoint_saved`` event (the reference
trainer), or the ``sha256`` of the last ``file_saved`` event the agent observed (a command
trainer's sampler writes ``file_sha256``). For the faulted run, whose files are at hand,
the manifest on disk must also still hash to that digest. Anything missing or mismatched
is "not judged", with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from faults import FaultPlan
from faults.data import DuplicateContaminationSpec
from faults.errors import FaultSpecError
from harness.oracles.base import ExpectOracle
from harness.oracles.checkpoints import locate
from harness.oracles.expectation import Expectation, ExpectModel
from harness.oracles.manifests import MANIFEST, sha256_file
from harness.oracles.verdict import Check, Evidence
from harness.records.events import CheckpointSaved, FileSaved
from harness.records.journal import Journal
from harness.run_layout import RunLayout

#: The sampler's file format this oracle reads (`reference_trainer.sample` writes it).
SAMPLES_FORMAT = 1
#: Largest samples file read (K generations of a few hundred tokens fit many times over).
MAX_SAMPLES_BYTES = 64 << 20


def normalized(text: str) -> str:
    """Lower case, runs of whitespace as one space: how the phrase is looked for."""
    return " ".join(text.casefold().split())


def contains(text: str, phrase: str) -> bool:
    """True when ``text`` holds ``phrase`` (case and spacing aside)."""
    return normalized(phrase) in normalized(text)


def planted_phrase(run_dir: Path) -> str | None:
    """The phrase a contamination fault of the run's plan plants; None when none does."""
    path = RunLayout(run_dir).plan
    if not path.is_file():
        return None
    try:
        plan = FaultPlan.from_yaml(path)
    except (FaultSpecError, OSError):
        return None
    phrases = [s.phrase for s in plan if isinstance(s, DuplicateContaminationSpec) and s.phrase]
    return phrases[0] if phrases else None


@dataclass(frozen=True, slots=True)
class Samples:
    """Generations one run's sampler wrote, and the weights it says they came from."""

    generations: list[str]
    step: int | None
    manifest_sha256: str | None
    file_sha256: str | None


def read_samples(path: Path) -> tuple[Samples | None, str]:
    """The samples at ``path`` and "", or None and what is wrong with the file."""
    try:
        if path.stat().st_size > MAX_SAMPLES_BYTES:
            return None, f"{path.name} is larger than {MAX_SAMPLES_BYTES} bytes"
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"{path.name} is missing (the sampler wrote none; see trainer.log)"
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return None, f"{path.name} is unreadable: {exc}"
    if not isinstance(data, dict) or data.get("format") != SAMPLES_FORMAT:
        return None, f"{path.name} is not a samples file of format {SAMPLES_FORMAT}"
    generations = data.get("generations")
    if not isinstance(generations, list) or not all(isinstance(g, str) for g in generations):
        return None, f"{path.name}: generations is not a list of texts"
    step = data.get("step")
    return Samples(
        generations=generations,
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        manifest_sha256=_digest(data.get("manifest_sha256")),
        file_sha256=_digest(data.get("file_sha256")),
    ), ""


def _digest(value: Any) -> str | None:
    return value.lower() if isinstance(value, str) and value else None


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none"


def provenance_problem(samples: Samples, journal: Journal, run_dir: Path | None) -> str:
    """Why ``samples`` are not known to come from the last checkpoint ``journal`` recorded
    ("" when they are); with ``run_dir``, the manifest on disk must still match too."""
    if samples.manifest_sha256 is not None:
        saves = [e for e in journal.of_kind(CheckpointSaved) if e.rank == 0]
        if not saves:
            return "the journal records no checkpoint_saved event to match them with"
        last = saves[-1]
        journaled = _digest(last.get("manifest_sha256"))
        if journaled is None:
            return f"the last checkpoint_saved (step {last.step}) records no manifest_sha256"
        if samples.manifest_sha256 != journaled or samples.step != last.step:
            return (
                f"they name step {samples.step} (manifest {_short(samples.manifest_sha256)}), "
                f"not the last checkpoint saved, step {last.step} (manifest {_short(journaled)})"
            )
        if run_dir is not None:
            manifest = locate(str(last.get("path")), run_dir) / MANIFEST
            try:
                on_disk = sha256_file(manifest)
            except OSError:
                return f"{manifest} is gone, so the weights cannot be checked"
            if on_disk != journaled:
                return f"{manifest} no longer hashes to the digest journaled at its save"
        return ""
    if samples.file_sha256 is not None:
        saves = journal.of_kind(FileSaved)
        if not saves:
            return "the journal records no file_saved event to match them with"
        last_hash = _digest(saves[-1].get("sha256"))
        if samples.file_sha256 != last_hash:
            return (
                f"they name file {_short(samples.file_sha256)}, not the last file saved "
                f"({_short(last_hash)})"
            )
        return ""
    return "they name no checkpoint (no manifest_sha256 or file_sha256)"


class PhraseCollapseExpect(ExpectModel):
    """Generations of the final model hold the contamination's phrase hardly more often
    than the fault-free baseline's."""

    max_increase: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Largest allowed rise of the share of generations holding the phrase.",
    )
    k: int = Field(default=64, ge=1, le=4096, description="Generations drawn from each run.")
    max_tokens: int = Field(default=48, ge=1, le=4096, description="Tokens per generation.")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seed of the draws.")
    top_k: int | None = Field(
        default=None, ge=1, le=1 << 20, description="Draw from the k likeliest tokens only."
    )


@dataclass(frozen=True)
class PhraseCollapseOracle(ExpectOracle):
    """The share of K generations holding the contamination's phrase rose by at most
    ``max_increase`` over the fault-free baseline's share."""

    name = "max_phrase_collapse"
    expectation = Expectation(
        type=PhraseCollapseExpect,
        order=14,
        baseline="always",
        passes_when="of `k` (64) generations of `max_tokens` (48) tokens drawn from the final "
        "weights (temperature 1, seeded by `seed`, from the `top_k` likeliest tokens when "
        "given), each where a new document starts after the tail of a held-out document (the "
        "same prompts for both runs), the share holding the `phrase` of the plan's "
        "`duplicate_contamination` fault (case and spacing aside) is at most `max_increase` "
        "(0.1) above the fault-free baseline's share. Generations count only when they name "
        "the run's last checkpoint: the step and manifest SHA-256 the journal's last "
        "`checkpoint_saved` recorded (and, for the faulted run, the manifest on disk still "
        "hashing to it); for a command trainer the `sha256` of its last `file_saved`. Not "
        "judged without a phrase, a baseline, a sampler (`trainer.sample_command`) or "
        "matching generations",
        figure="increase of the share",
    )
    max_increase: float = 0.1
    k: int = 64

    @classmethod
    def from_expect(cls, value: Any) -> PhraseCollapseOracle:
        """From a `PhraseCollapseExpect`."""
        if not isinstance(value, PhraseCollapseExpect):
            return cls()
        return cls(max_increase=value.max_increase, k=value.k)

    def judge(self, evidence: Evidence) -> Check:
        """Share with the phrase in the faulted run minus that in the baseline run."""
        expected = f"<= {self.max_increase:g} more of {self.k} generations"

        def missing(detail: str) -> Check:
            return self.not_judged(detail, unit="share", expected=expected)

        phrase = planted_phrase(evidence.run_dir)
        if phrase is None:
            return missing("no fault of the plan plants a phrase (duplicate_contamination.phrase)")
        if evidence.baseline is None:
            return missing("no fault-free baseline run to compare the generations with")
        layout = RunLayout(evidence.run_dir)
        hits: list[int] = []
        for path, journal, run_dir, which in (
            (layout.samples, evidence.journal, evidence.run_dir, "faulted run"),
            (layout.baseline_samples, evidence.baseline, None, "baseline run"),
        ):
            samples, problem = read_samples(path)
            if samples is None:
                return missing(f"no generations of the {which}: {problem}")
            if len(samples.generations) != self.k:
                return missing(
                    f"the {which}'s sampler wrote {len(samples.generations)} generations, "
                    f"not the {self.k} asked for"
                )
            problem = provenance_problem(samples, journal, run_dir)
            if problem:
                return missing(
                    f"the {which}'s generations are not known to be of its final weights: {problem}"
                )
            hits.append(sum(contains(g, phrase) for g in samples.generations))
        faulted, baseline = (n / self.k for n in hits)
        increase = faulted - baseline
        return self.verdict(
            increase <= self.max_increase + 1e-12,
            increase,
            unit="share",
            expected=expected,
            detail=f"{hits[0]} of {self.k} generations ({faulted:.1%}) hold {phrase!r}, "
            f"against {hits[1]} ({baseline:.1%}) of the fault-free baseline's",
            share=faulted,
            baseline_share=baseline,
            k=self.k,
        )
