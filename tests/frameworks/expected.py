"""Verdicts on trainers written with real frameworks: the table of what each check must say,
and the two checks of it that tests/test_frameworks_one_rank.py and
tests/test_frameworks_two_ranks.py run on their suites.

`tests/frameworks/` holds one script per framework (the Hugging Face Trainer, Lightning,
Accelerate, a torchrun loop saving with torch.distributed.checkpoint under DDP and FSDP2),
each written the way that framework's docs show and knowing nothing of tightrope;
`tests/frameworks/one_rank.yaml`, `two_ranks.yaml` and `dcp.yaml` run each under a NaN
gradient guarded and unguarded, killed and resumed the framework's own way, and resumed
from a newest checkpoint with a flipped bit or cut in half, through the zero-code attach;
the fault-free run each scenario is compared with (its baseline) is judged as well.

The expected verdicts are not what tightrope said once: each rests on a fact read from the
framework's own files by `tests/frameworks/truth.py` (the weights of its last checkpoint,
the step its resume loaded, the bytes of the checkpoint it loaded against an undamaged run's),
and `check_facts` checks those facts on the same run dirs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.oracles.health import CompletedOracle, ParamsFiniteOracle
from harness.oracles.verdict import Check, Evidence
from harness.records.journal import read_journal
from harness.running.results import SuiteResult
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import load_suite
from tests.frameworks import truth

ROOT = Path(__file__).resolve().parents[2]
STEPS, KILLED_AT, DAMAGED_STEP = 30, 18, 16

P, F = "passed", "failed"
#: clean: params_finite, completed.
CLEAN = {"params_finite": (P, 0), "completed": (P, STEPS)}
#: No guard: the NaN gradient reaches AdamW and the last checkpoint's weights are NaN
#: (truth.weights_finite is False); the framework trains on to the end and exits 0.
NAN = {
    "detected": (F, None),
    "params_finite": (F, None),
    "max_lost_steps": (P, 0),
    "completed": (P, STEPS),
}
#: The guard drops the update of step 12 (its message in the log), the last checkpoint is
#: finite: one step lost, the skip itself is the detection.
GUARDED = {
    "detected": (P, 0),
    "params_finite": (P, 0),
    "max_lost_steps": (P, 1),
    "completed": (P, STEPS),
}
#: Killed at step 18; the framework's resume loaded its checkpoint of step 16
#: (truth.resumed_from), trained 17-18 again and ended at 30; nothing damaged was loaded.
KILLED = {
    "detected": (P, None),
    "completed": (P, STEPS),
    "max_lost_steps": (P, KILLED_AT - DAMAGED_STEP),
    "no_corrupt_checkpoint_loaded": (P, 0),
}


def silently_loaded(ranks: int) -> dict[str, tuple[str, object]]:
    """A bit flipped in the newest checkpoint's weights: every rank loads it without a
    complaint (truth.load_outcome: not refused, final weights differ from the undamaged run's)
    and trains on to the end. Nothing noticed the damage (the restart answers the kill)."""
    return KILLED | {"detected": (F, None), "no_corrupt_checkpoint_loaded": (F, ranks)}


def refused(last_step: int) -> dict[str, tuple[str, object]]:
    """The newest checkpoint cut in half: the framework raises on load (truth.load_outcome:
    refused) and, falling back to nothing, the restarted job fails: not completed. Raising
    loaded nothing corrupt; but with no other checkpoint taken instead, no detection is
    observed (a crash on load is not a checkpoint_integrity response)."""
    return KILLED | {
        "detected": (F, None),
        "completed": (F, last_step),
        "max_lost_steps": (P, 0),
    }


#: scenario -> check -> (status, figure); None: any figure. A name ending in ``-clean`` is
#: the fault-free baseline of the scenario named by `FAULT_FREE`.
TABLE: dict[str, dict[str, tuple[str, object]]] = {
    "hf-clean": CLEAN,
    "hf-ddp-clean": CLEAN,
    "hf-nan": NAN,
    "hf-guard-nan": GUARDED,
    "hf-kill": KILLED,
    "hf-bitflip": silently_loaded(ranks=2),
    "hf-truncate": refused(KILLED_AT),  # safetensors: "incomplete metadata, file not fully covered"
    "lightning-clean": CLEAN,
    "lightning-nan": NAN,
    "lightning-guard-nan": GUARDED,
    "lightning-kill": KILLED,
    "lightning-bitflip": silently_loaded(ranks=1),  # torch.load checks no CRC
    "lightning-truncate": refused(KILLED_AT),  # "failed finding central directory"
    "accelerate-clean": CLEAN,
    "accelerate-nan": NAN,
    "accelerate-guard-nan": GUARDED,
    "accelerate-kill": KILLED,
    "accelerate-bitflip": silently_loaded(ranks=1),
    "accelerate-truncate": refused(KILLED_AT),
    "dcp-clean": CLEAN,
    "dcp-fsdp-clean": CLEAN,
    "dcp-nan": NAN,
    "dcp-guard-nan": GUARDED,
    "dcp-kill": KILLED,
    "dcp-bitflip": silently_loaded(ranks=2),
    "dcp-truncate": refused(KILLED_AT),
    "dcp-fsdp-kill": KILLED,
}
#: The fault-free runs judged: the baseline of which scenario.
FAULT_FREE = {
    "hf-clean": "hf-nan",
    "hf-ddp-clean": "hf-kill",
    "lightning-clean": "lightning-nan",
    "accelerate-clean": "accelerate-nan",
    "dcp-clean": "dcp-nan",
    "dcp-fsdp-clean": "dcp-fsdp-kill",
}
#: The scenarios whose job ends in an error: the framework refused the damaged checkpoint.
CRASHED = {"hf-truncate", "lightning-truncate", "accelerate-truncate", "dcp-truncate"}


def run_suite_of(suites: Path | list[Path], out_dir: Path) -> SuiteResult:
    """Run ``suites`` (their trainers named relative to the repository) into ``out_dir``,
    several as one run (named as the first)."""
    loaded = [load_suite(path) for path in ([suites] if isinstance(suites, Path) else suites)]
    scenarios = [scenario for suite in loaded for scenario in suite.scenarios]
    options = RunOptions(out_dir=out_dir / "out", cache_dir=out_dir / "cache", cores=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        suite = loaded[0].model_copy(update={"scenarios": scenarios})
        return run_suite(suite, options, progress=False)


def run_dir(verdicts: SuiteResult, out_dir: Path, name: str) -> Path:
    """Where scenario ``name`` ran (a ``-clean`` name: its baseline, in the run cache, where
    its checkpoints are kept; see FAULT_FREE)."""
    if name in FAULT_FREE:
        result = next(r for r in verdicts.scenarios if r.name == FAULT_FREE[name])
        assert result.baseline_dir, (
            f"{FAULT_FREE[name]} kept no baseline ({result.status}: {result.error})"
        )
        return out_dir / "cache" / result.baseline_dir
    result = next(r for r in verdicts.scenarios if r.name == name)
    return out_dir / "out" / result.run_dir


def judge_fault_free(verdicts: SuiteResult, out_dir: Path, name: str) -> dict[str, Check]:
    """The fault-free run's checks: its weights finite, trained to the end and finished."""
    where = run_dir(verdicts, out_dir, name)
    evidence = Evidence(journal=read_journal(where), run_dir=where, target_steps=STEPS)
    return {o.name: o.judge(evidence) for o in (ParamsFiniteOracle(), CompletedOracle())}


def check_verdicts(verdicts: SuiteResult, out_dir: Path, names: set[str]) -> None:
    """Every verdict of the scenarios ``names`` is the table's."""
    measured = {
        r.name: {c.name: (c.status, c.figure) for c in r.checks} for r in verdicts.scenarios
    }
    for name in names & FAULT_FREE.keys():
        checks = judge_fault_free(verdicts, out_dir, name)
        measured[name] = {c.name: (c.status, c.figure) for c in checks.values()}
    crashed = {r.name for r in verdicts.scenarios if r.error}
    table = {name: checks for name, checks in TABLE.items() if name in names}
    expected = {
        name: {check: (status, measured.get(name, {}).get(check, (None, None))[1])
               if figure is None else (status, figure)
               for check, (status, figure) in checks.items()}
        for name, checks in table.items()
    }  # fmt: skip
    wrong = [
        f"{name}.{check}: expected {want}, measured {measured.get(name, {}).get(check)}"
        for name, checks in expected.items()
        for check, want in checks.items()
        if measured.get(name, {}).get(check) != want
    ]
    errors = {r.name: r.error for r in verdicts.scenarios if r.error}
    wrong += [f"{name}: crashed {name in crashed}, expected {name in CRASHED}: {errors.get(name)}"
              for name in sorted(crashed ^ (CRASHED & names))]  # fmt: skip
    wrong += [f"{name}: not run" for name in sorted(table.keys() - measured.keys())]
    assert not wrong, "\n".join(wrong)
    assert {name: measured[name] for name in table} == expected


def check_facts(verdicts: SuiteResult, out_dir: Path, names: set[str]) -> None:
    """What the table rests on holds, read from the frameworks' own files."""
    facts: dict[str, dict[str, object]] = {}
    expected: dict[str, dict[str, object]] = {}
    for name in sorted(names):
        framework = truth.framework_of(name)
        run = run_dir(verdicts, out_dir, name)
        fact: dict[str, object] = {"final_step": truth.final_step(run)}
        if name.endswith(("-clean", "-nan")):
            fact["weights_finite"] = truth.weights_finite(run, framework)
        if name.endswith(("-kill", "-bitflip")):  # a refused load may print its resume first
            fact["resumed_from"] = sorted(set(truth.resumed_from(run, framework)))
        if name.endswith(("-bitflip", "-truncate")):
            reference = run_dir(verdicts, out_dir, f"{framework}-kill")
            outcome = truth.load_outcome(run, reference, framework)
            fact["refused"], fact["diverged"] = outcome.refused, outcome.diverged
            if framework != "lightning":  # Lightning overwrites last.ckpt at the next save
                fact["damaged"] = bool(truth.damaged_files(run, reference, framework, DAMAGED_STEP))
        facts[name] = fact
        if name.endswith("-clean") or name.endswith("-guard-nan"):
            expected[name] = {"final_step": STEPS, "weights_finite": True}
        elif name.endswith("-nan"):
            expected[name] = {"final_step": STEPS, "weights_finite": False}
        elif name.endswith("-kill"):
            expected[name] = {"final_step": STEPS, "resumed_from": [DAMAGED_STEP]}
        else:
            loaded = name.endswith("-bitflip")
            expected[name] = {
                "final_step": STEPS if loaded else None,
                "refused": not loaded,
                "diverged": loaded and framework != "dcp",  # DCP's flip landed in a wrapper
            } | ({"resumed_from": [DAMAGED_STEP]} if loaded else {})
            expected[name] |= {} if framework == "lightning" else {"damaged": True}
    wrong = [
        f"{name}.{key}: expected {value!r}, found {facts[name].get(key)!r}"
        for name, fact in expected.items()
        for key, value in fact.items()
        if facts[name].get(key) != value
    ]
    assert not wrong, "\n".join(wrong)
    assert facts == expected
