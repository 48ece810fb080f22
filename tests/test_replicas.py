"""Replica consistency: the agent's parameter fingerprint sees one flipped bit, the
`replicas_consistent` oracle judges any data-parallel run from those fingerprints, and the
reference trainer's `replica_check` restores a checkpoint when one rank's weights diverge
silently (without it, the run ends with replicas that disagree and a loss that looks fine)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from faults import FaultPlan
from harness.inside.step_evidence import params_fingerprint
from harness.oracles import ReplicasConsistentOracle
from harness.oracles.verdict import Check, Evidence
from harness.records.journal import read_journal
from harness.replica_prints import odd_ranks

from .conftest import torchrun
from .oracle_runs import Run


def model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bit", [0, 7, 22, 31])
def test_one_flipped_bit_changes_the_fingerprint(dtype: torch.dtype, bit: int) -> None:
    a, b = model(dtype), model(dtype)
    assert params_fingerprint(a) == params_fingerprint(b)
    width = torch.finfo(dtype).bits
    with torch.no_grad():
        weight = b[2].weight.view(-1)
        ints = weight.view({16: torch.int16, 32: torch.int32, 64: torch.int64}[width])
        ints[5] ^= 1 << (bit % (width - 1))  # never the sign of an int: a plain xor
    assert params_fingerprint(a) != params_fingerprint(b)


def test_the_lowest_mantissa_bit_of_a_tiny_weight_still_counts() -> None:
    # A sum of float values would lose a change of 1 ulp of 1e-30; a sum of bit patterns cannot.
    a, b = model(), model()
    with torch.no_grad():
        a[0].weight[0, 0] = b[0].weight[0, 0] = 1e-30
        raw = struct.unpack("<i", struct.pack("<f", 1e-30))[0]
        b[0].weight[0, 0] = struct.unpack("<f", struct.pack("<i", raw ^ 1))[0]
    assert params_fingerprint(a) != params_fingerprint(b)


@pytest.mark.parametrize(
    ("prints", "odd"),
    [
        ({0: "a", 1: "a"}, []),
        ({0: "a", 1: "b"}, [0, 1]),  # two ranks: no majority, both named
        ({0: "a", 1: "b", 2: "a"}, [1]),
        ({0: "a", 1: "b", 2: "c", 3: "a"}, [1, 2]),
        ({0: "a", 1: "a", 2: "b", 3: "b"}, [0, 1, 2, 3]),
    ],
)
def test_the_rank_that_differs_is_the_one_outside_the_majority(
    prints: dict[int, str], odd: list[int]
) -> None:
    assert odd_ranks(prints) == odd


def judge(run: Run) -> Check:
    return ReplicasConsistentOracle().judge(run.evidence())


def fingerprinted(tmp_path: Path, world_size: int = 2) -> Run:
    """Two ranks whose steps 10, 20 and 30 carry agreeing fingerprints."""
    run = Run(tmp_path, world_size=world_size)
    for step in range(1, 31):
        fields = {"params_fingerprint": f"{step:016x}"} if step % 10 == 0 else {}
        run.step(step, **fields)
    return run


def test_agreeing_replicas_pass(tmp_path: Path) -> None:
    check = judge(fingerprinted(tmp_path).end())
    assert check.passed and check.figure == 0
    assert "every rank agrees at all 3 compared steps" in check.detail


def test_a_diverged_rank_fails_and_is_named(tmp_path: Path) -> None:
    run = fingerprinted(tmp_path, world_size=3)
    run.emit("step", 30, rank=2, loss=4.4, params_fingerprint="ffffffffffffffff")  # redone
    check = judge(run.end())
    assert not check.passed and check.figure == 1
    assert "the first at step 30 (rank(s) 2 differ)" in check.detail


def test_a_divergence_rolled_back_and_redone_counts_by_its_redone_step(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 19)
    run.step(20, params_fingerprint="00000000000000aa")
    run.steps(21, 29)
    run.emit("step", 30, rank=0, loss=4.4, params_fingerprint="00000000000000bb")
    run.emit("step", 30, rank=1, loss=4.4, params_fingerprint="00000000000000cc")
    run.rollback(30, to=20).steps(21, 29).step(30, params_fingerprint="00000000000000dd")
    assert judge(run.end()).passed
    # The negative control: the same divergence with no rollback after it fails.
    failed = Run(tmp_path / "kept", world_size=2).steps(1, 29)
    failed.emit("step", 30, rank=0, loss=4.4, params_fingerprint="00000000000000bb")
    failed.emit("step", 30, rank=1, loss=4.4, params_fingerprint="00000000000000cc")
    assert not judge(failed.end()).passed


def test_one_rank_or_no_fingerprint_is_not_judged(tmp_path: Path) -> None:
    alone = judge(fingerprinted(tmp_path / "one", world_size=1).end())
    assert not alone.judged and "only one rank" in alone.detail
    bare = judge(Run(tmp_path / "bare", world_size=2).steps(1, 30).end())
    assert not bare.judged and "no step carries" in bare.detail


FLIP = {
    "kind": "bitflip",
    "at_step": 15,
    "ranks": [1],
    "tensor": "weights",
    "target": "blocks.1.mlp.*",
    "bit": 23,  # the lowest exponent bit: 4 weights doubled or halved, finite and quiet
    "count": 4,
}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("checked", [True, False], ids=["with", "without"])
def test_a_silent_bitflip_on_one_replica(tmp_path: Path, checked: bool) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(FaultPlan.from_dict({"faults": [FLIP]}).to_dict()))
    extra = [] if checked else ["--disable", "replica_check"]
    args = ["--preset", "tiny", "--steps", "30", "--checkpoint-every", "10", "--log-every", "1000"]
    proc = torchrun(2, *args, "--fault-plan", str(plan), *extra, "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    journal = read_journal(tmp_path / "r")
    evidence = Evidence(journal=journal, run_dir=tmp_path / "r", target_steps=30, exit_code=0)
    check = ReplicasConsistentOracle().judge(evidence)
    detected = [e for e in journal.of_kind("detected") if e.get("detector") == "replica_divergence"]
    if checked:
        assert check.passed, check.detail
        assert (
            detected
            and detected[0].step == 20
            and detected[0]["details"]["differing_ranks"] == [0, 1]
        )
        assert any(e.get("action") == "rollback" for e in journal.of_kind("recovered"))
    else:
        assert not check.passed and check.figure >= 1, check.detail
        assert not detected
