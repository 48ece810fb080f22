"""Straggler scores and the collective ledger's attribution, on figures and files made
here: who is flagged, after how many steps, and who is named when a collective fails or
hangs; the fail-slow and collective faults acting on every ``torch.distributed`` collective
a trainer calls, and on nothing while no fault is due."""

from __future__ import annotations

import copy
import functools
import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from faults import build_injector, parse_fault
from faults.collective import COLLECTIVES, CollectiveFailInjector, CollectiveHangInjector
from faults.errors import FaultSpecError
from faults.injector import StepContext
from faults.slow import SlowLinkInjector, StragglerInjector
from harness.records.journal import JournalWriter, read_journal
from harness.run_layout import RunLayout
from reference_trainer.processes.collective_blame import blame_failed_collective
from reference_trainer.processes.collective_counts import counts, culprits
from reference_trainer.processes.collective_ledger import CollectiveLedger
from reference_trainer.processes.hang_monitor import blame_collective
from reference_trainer.stability.mechanism import Boundary, StepState
from reference_trainer.stability.straggler_step import StragglerWatch
from reference_trainer.stability.stragglers import StragglerConfig, StragglerScores
from tests.conftest import end_gloo_group

# -- scores ---------------------------------------------------------------------------------


def feed(scores: StragglerScores, rows: list[list[float]]) -> list[tuple[int, int]]:
    """(step, rank) of every flag raised while feeding ``rows`` (one per step, from 1)."""
    return [(step, f.rank) for step, row in enumerate(rows, 1) for f in scores.observe(step, row)]


def test_a_rank_slow_for_patience_steps_is_flagged_once() -> None:
    cfg = StragglerConfig(threshold=0.7, window=1, patience=3, min_gap_ms=0)
    rows = [[0.1, 0.1]] * 3 + [[0.1, 0.3]] * 6 + [[0.1, 0.1]] * 3
    assert feed(StragglerScores(cfg, 2), rows) == [(6, 1)]


def test_a_short_slowdown_and_a_mild_one_are_not_flagged() -> None:
    cfg = StragglerConfig(threshold=0.7, window=1, patience=3, min_gap_ms=0)
    short = [[0.1, 0.1]] * 3 + [[0.1, 0.5]] * 2 + [[0.1, 0.1]] * 5
    mild = [[0.1, 0.13]] * 10  # score 0.77: above 0.7
    assert feed(StragglerScores(cfg, 2), short) == []
    assert feed(StragglerScores(cfg, 2), mild) == []


def test_the_median_window_absorbs_a_single_slow_step() -> None:
    cfg = StragglerConfig(threshold=0.7, window=3, patience=1, min_gap_ms=0)
    rows = [[0.1, 0.1]] * 4 + [[0.1, 1.0]] + [[0.1, 0.1]] * 4
    assert feed(StragglerScores(cfg, 2), rows) == []


def test_a_rank_that_recovers_is_flagged_again_when_slow_again() -> None:
    cfg = StragglerConfig(window=1, patience=2, min_gap_ms=0)
    rows = [[0.3, 0.1]] * 3 + [[0.1, 0.1]] + [[0.3, 0.1]] * 2
    assert feed(StragglerScores(cfg, 2), rows) == [(2, 0), (6, 0)]


def test_a_gap_below_min_gap_ms_is_never_slow() -> None:
    cfg = StragglerConfig(window=1, patience=1, min_gap_ms=2.0)
    assert feed(StragglerScores(cfg, 2), [[0.001, 0.0025]] * 5) == []  # 1.5 ms apart
    assert feed(StragglerScores(cfg, 2), [[0.001, 0.004]] * 1) == [(1, 1)]


def test_the_score_is_the_fastest_over_the_rank() -> None:
    scores = StragglerScores(StragglerConfig(window=1), 4)
    scores.observe(1, [0.2, 0.1, 0.4, 0.1])
    assert scores.scores == [0.5, 1.0, 0.25, 1.0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("threshold", 1.0), ("threshold", 0.0), ("window", 0), ("patience", True),
     ("min_gap_ms", -1.0), ("after_save", -1)],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"stability.stragglers.{field}"):
        StragglerConfig(**{field: value})  # type: ignore[arg-type]


def test_wrong_number_of_times_is_refused() -> None:
    with pytest.raises(ValueError, match="expected 2 compute times, got 3"):
        StragglerScores(StragglerConfig(), 2).observe(1, [0.1, 0.1, 0.1])


# -- the collective ledger's files ----------------------------------------------------------


def write_count(run_dir: Path, rank: int, seq: int, restart: int = 0) -> None:
    path = RunLayout(run_dir).collective_file(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seq": seq, "restart": restart, "wall": 0.0, "pid": 1}))


def test_the_rank_below_the_highest_count_is_the_culprit(tmp_path: Path) -> None:
    for rank, seq in enumerate([15, 14, 15, 15]):
        write_count(tmp_path, rank, seq)
    assert culprits(counts(tmp_path, 4, 0), 4) == [1]


def test_no_culprit_when_counts_agree_or_a_rank_has_no_file(tmp_path: Path) -> None:
    write_count(tmp_path, 0, 15)
    assert culprits(counts(tmp_path, 2, 0), 2) == []  # rank 1 may never have started
    write_count(tmp_path, 1, 15)
    assert culprits(counts(tmp_path, 2, 0), 2) == []
    write_count(tmp_path, 1, 3, restart=1)  # another attempt's count is not compared
    assert counts(tmp_path, 2, 0) == {0: 15}


def test_the_hang_monitor_names_the_rank_that_never_entered(tmp_path: Path) -> None:
    write_count(tmp_path, 0, 15)
    write_count(tmp_path, 1, 14)
    with JournalWriter(tmp_path, 0, restart=0) as journal:
        assert blame_collective(journal, tmp_path, 2, {"step": 7, "restart": 0}) == [1]
    events = read_journal(tmp_path)
    blamed = [e for e in events if e.kind == "rank_blamed"]
    assert [(e.get("blamed_rank"), e.get("detector")) for e in blamed] == [
        (1, "collective_watchdog")
    ]


def test_a_failed_collective_names_the_rank_behind_and_not_other_errors(tmp_path: Path) -> None:
    write_count(tmp_path, 0, 9)
    write_count(tmp_path, 1, 8)
    claims: list[object] = []
    error = RuntimeError("DistBackendError: all_reduce failed")
    found = blame_failed_collective(
        error, tmp_path, world_size=2, restart=0, claim=claims.append, timeout=0.1
    )
    assert found == [1] and [type(c).__name__ for c in claims] == ["Detected", "RankBlamed"]
    assert blame_failed_collective(
        ValueError("bad batch"), tmp_path, world_size=2, restart=0, claim=claims.append,
        timeout=0.1,
    ) == []  # fmt: skip


# -- the ledger and the faults on a real (one-rank, gloo) all_reduce -------------------------


@pytest.fixture
def group(tmp_path: Path):  # type: ignore[no-untyped-def]
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    end_gloo_group()


def ctx() -> StepContext:
    return StepContext(step=3, rank=0, world_size=1)


def test_a_fault_above_the_ledger_keeps_its_call_uncounted(tmp_path: Path, group: None) -> None:
    ledger = CollectiveLedger(tmp_path, rank=0, restart=0).install()
    try:
        dist.all_reduce(torch.ones(2))
        assert counts(tmp_path, 1, 0) == {0: 1}
        fail = CollectiveFailInjector(parse_fault({"kind": "collective_fail", "at_step": 3}))
        records = fail.before_forward(ctx())
        assert records and records[0].details["rank"] == 0
        with pytest.raises(
            RuntimeError, match=r"all_reduce failed on rank 0 \(injected at step 3\)"
        ):
            dist.all_reduce(torch.ones(2))
        assert counts(tmp_path, 1, 0) == {0: 1}  # never entered: not counted
        dist.all_reduce(torch.ones(2))  # once: the next call goes through
        fail.end_step(ctx())
        assert counts(tmp_path, 1, 0) == {0: 2} and ledger.take_seconds() > 0
    finally:
        ledger.uninstall()


def test_a_hang_blocks_the_call_alive_and_slow_link_delays_it(group: None) -> None:
    hang = CollectiveHangInjector(
        parse_fault({"kind": "collective_hang", "at_step": 3, "resume_after": 0.3})
    )
    hang.before_forward(ctx())
    started = time.perf_counter()
    dist.all_reduce(torch.ones(2))
    assert time.perf_counter() - started >= 0.3
    hang.end_step(ctx())
    link = SlowLinkInjector(parse_fault({"kind": "slow_link", "at_step": 3, "latency_ms": 100}))
    link.before_forward(ctx())
    started = time.perf_counter()
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(2))
    assert time.perf_counter() - started >= 0.2
    wrapped = dist.all_reduce
    link.end_step(ctx())
    assert dist.all_reduce is not wrapped and not link.tap.armed  # the plain call is back


def calls() -> dict[str, Callable[[], object]]:
    """One call of each wrapped collective on a one-rank group."""
    t = torch.ones(2)
    return {
        "all_reduce": lambda: dist.all_reduce(t),
        "broadcast": lambda: dist.broadcast(t, 0),
        "all_gather": lambda: dist.all_gather([torch.zeros(2)], t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(2), t),
        "all_gather_single": lambda: dist.all_gather_single(torch.zeros(2), t),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(2), [t]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(2), t),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(torch.zeros(2), t),
        "barrier": lambda: dist.barrier(),
    }


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the deprecated tensor forms
def test_every_collective_fails_hangs_and_is_delayed(group: None) -> None:
    """Each collective a trainer calls meets each fault (the tap is not all_reduce's
    alone), and once the step ends every function is the very one it was before."""
    assert set(calls()) == set(COLLECTIVES)
    before = {name: getattr(dist, name) for name in COLLECTIVES}
    for name, call in calls().items():
        fail = CollectiveFailInjector(parse_fault({"kind": "collective_fail", "at_step": 3}))
        fail.before_forward(ctx())
        with pytest.raises(RuntimeError, match=rf"{name} failed on rank 0 \(injected at step 3"):
            call()
        call()  # once
        fail.end_step(ctx())
        hang = CollectiveHangInjector(
            parse_fault({"kind": "collective_hang", "at_step": 3, "resume_after": 0.05})
        )
        link = SlowLinkInjector(parse_fault({"kind": "slow_link", "at_step": 3, "latency_ms": 50}))
        hang.before_forward(ctx())
        link.before_forward(ctx())
        started = time.perf_counter()
        call()  # blocked 0.05 s, then delayed 0.05 s
        assert time.perf_counter() - started >= 0.1, name
        assert hang.tap.seen == [name] and link.tap.seen == [name]
        hang.end_step(ctx())  # removed out of order: the inner wrapper stays, inert
        link.end_step(ctx())
        assert getattr(dist, name) is not before[name]
        started = time.perf_counter()
        call()
        assert time.perf_counter() - started < 0.05 and link.tap.seen == [name]
        for each, function in before.items():  # the inert wrappers out, for the next call
            setattr(dist, each, function)


def test_a_fault_not_due_on_this_rank_wraps_nothing(group: None) -> None:
    before = {name: getattr(dist, name) for name in COLLECTIVES}
    for kind in ("slow_link", "collective_fail", "collective_hang"):
        injector = build_injector(parse_fault({"kind": kind, "at_step": 3, "ranks": [1]}))
        assert injector.before_forward(StepContext(step=3, rank=0, world_size=2)) == []
        assert {name: getattr(dist, name) for name in COLLECTIVES} == before
        injector.end_step(StepContext(step=3, rank=0, world_size=2))
        assert {name: getattr(dist, name) for name in COLLECTIVES} == before


def test_a_wrapped_collective_copies_and_pickles_as_the_plain_one(group: None) -> None:
    """A trainer's object holding a collective (a partial) pickles while a fault is armed,
    and what it loads is torch's own function, with no fault in it."""
    plain = dist.broadcast
    link = SlowLinkInjector(parse_fault({"kind": "slow_link", "at_step": 3, "latency_ms": 1}))
    link.before_forward(ctx())
    try:
        held = functools.partial(dist.broadcast, src=0)
        assert held.func is not plain
        loaded = pickle.loads(pickle.dumps(held))
        assert loaded.func is plain and copy.deepcopy(held).func is plain
        loaded(torch.ones(2))
        assert link.tap.seen == []  # the loaded copy went around the tap
    finally:
        link.end_step(ctx())
    assert dist.broadcast is plain


def test_a_straggler_spins_factor_minus_one_times_its_passes() -> None:
    injector = StragglerInjector(parse_fault({"kind": "straggler", "at_step": 3, "factor": 3}))
    injector.before_forward(ctx())
    time.sleep(0.05)
    started = time.perf_counter()
    [record] = injector.after_backward(ctx())
    busy = time.perf_counter() - started
    assert record.details["busy_seconds"] == pytest.approx(
        2 * record.details["passes_seconds"], abs=1e-5
    )
    assert busy >= record.details["busy_seconds"] >= 0.1


def test_fail_slow_specs_refuse_bad_values() -> None:
    with pytest.raises(FaultSpecError, match="factor"):
        parse_fault({"kind": "straggler", "at_step": 3, "factor": 1.0})
    with pytest.raises(FaultSpecError, match="resume_after"):
        parse_fault({"kind": "collective_hang", "at_step": 3, "resume_after": 0})


def test_the_mechanism_names_the_slow_rank_but_not_after_a_save() -> None:
    """Rank 0 claims `straggler` and `rank_blamed` for rank 1 once it has been slow for
    `patience` scored steps; the `after_save` steps after a save are not scored."""
    cfg = StragglerConfig()  # threshold 0.7, patience 5, after_save 3
    watch = StragglerWatch(cfg, rank=0, world_size=2)
    claims: list[object] = []
    for step in range(1, 16):
        s = StepState(step, 1e-3)
        watch.agreed(s, torch.tensor([0.1, 0.3]))
        claims += [(step, type(c).__name__, getattr(c, "blamed_rank", None)) for c in s.claims]
        if step == 4:  # a save after step 4, as the trainer asks after its agreement
            watch.between_steps(Boundary(step, save_due=True))  # steps 5-7 not scored
    # Scored slow steps: 1-4, then 8 (the fifth): flagged there, once.
    assert claims == [(8, "Detected", None), (8, "RankBlamed", 1)]
    other = StragglerWatch(cfg, rank=1, world_size=2)
    s = StepState(1, 1e-3)
    for step in range(1, 7):
        s = StepState(step, 1e-3)
        other.agreed(s, torch.tensor([0.1, 0.3]))
    assert s.claims == []  # rank 0 alone journals
