"""What tightrope attaches to a trainer's model and optimizer never changes or breaks it.

Every feature a scenario launch turns on (the explicit attach, the microscope, metrics, a
fault armed with its hooks in place, ``tightrope exec``) against every thing a trainer does
with its model: ``torch.save`` and ``torch.load`` it whole, pickle it, ``copy.deepcopy`` it
(an EMA copy), ``torch.compile`` it, save its state dict, and train it to the same losses
bit for bit. A new hook that breaks one of these fails here; the negative controls at the
end show the checks catch such a hook.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import harness
from faults import FaultPlan
from harness.inside.attach import AttachedAgent
from harness.inside.hooks import OutputHook
from harness.records.microscope_file import read_microscope

from .conftest import end_gloo_group
from .side_effects_support import (
    CHECKS,
    STEPS,
    Trained,
    batches,
    hooks_of,
    live,
    loss_of,
    make_model,
    make_optimizer,
    probe_input,
    state_keys,
    train,
)

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "side_effects_support.py"
#: The microscope recording every step (its heaviest setting), with a short window.
MICROSCOPE = {"TIGHTROPE_MICROSCOPE": "every=1,window=2"}
METRICS = {"TIGHTROPE_METRICS_FILE": "1"}
#: A gradient fault at the step the checks run in: its hooks are on the parameters, and
#: it fires only at that step's backward.
ARMED = {"faults": [{"kind": "nan_grad", "at_step": STEPS + 1, "target": "*"}]}


@dataclass(frozen=True)
class Feature:
    """What a launch turns on: the agent attached, with these variables and this plan."""

    attached: bool = True
    env: dict[str, str] = field(default_factory=dict)
    plan: dict[str, object] | None = None


FEATURES = {
    "none": Feature(attached=False),  # the control: the checks pass without tightrope
    "attach": Feature(),
    "microscope": Feature(env=MICROSCOPE),
    "metrics": Feature(env=METRICS),
    "fault_armed": Feature(plan=ARMED),
    "everything": Feature(env={**MICROSCOPE, **METRICS}, plan=ARMED),
}
#: Under ``tightrope exec``: the run's own process, hooked by the global hooks, with all of
#: the above on (each subprocess costs seconds; the reported crash has its own test below).
EXEC_FEATURES = {"exec_everything": Feature(env={**MICROSCOPE, **METRICS}, plan=ARMED)}


@pytest.fixture
def launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Feature], Trained]]:
    """Train the model with a feature on; the agent is closed when the test ends."""
    agents: list[AttachedAgent] = []

    def start(feature: Feature) -> Trained:
        for name in (*MICROSCOPE, *METRICS):
            monkeypatch.delenv(name, raising=False)
        for name, value in feature.env.items():
            monkeypatch.setenv(name, value)
        model = make_model()
        optimizer = make_optimizer(model)
        if not feature.attached:
            return train(model, optimizer)
        run_dir = tmp_path / f"run{len(agents)}"
        plan = FaultPlan.from_dict(feature.plan) if feature.plan else None
        agent = harness.attach(model, optimizer, run_dir=run_dir, plan=plan)
        agents.append(agent)
        trained = train(model, optimizer, run_dir)
        # The feature is on, its hooks in place: else the checks would prove nothing.
        if plan is not None:  # the moment the checks run in: hooks in, nothing fired
            assert any(p._post_accumulate_grad_hooks for p in model.parameters())
            assert "fault_injected" not in agent.journal.read_text()
        if MICROSCOPE.keys() <= feature.env.keys():
            assert any(isinstance(h, OutputHook) for h in hooks_of(model))
        if METRICS.keys() <= feature.env.keys():
            assert agent.agent.metrics is not None
        return trained

    yield start
    for agent in agents:
        agent.close()


@pytest.fixture(scope="module")
def plain() -> Trained:
    """The trainer alone, to compare with."""
    model = make_model()
    return train(model, make_optimizer(model))


# -- in process ----------------------------------------------------------------------------


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_the_model_survives(feature: str, check: str, launch: Callable[[Feature], Trained]) -> None:
    CHECKS[check](launch(FEATURES[feature]))


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_losses_and_weights_are_bit_identical(
    feature: str, launch: Callable[[Feature], Trained], plain: Trained
) -> None:
    trained = launch(FEATURES[feature])
    assert len(trained.losses) == STEPS + 1
    assert torch.equal(torch.stack(trained.losses), torch.stack(plain.losses))
    for (name, mine), theirs in zip(
        trained.model.named_parameters(), plain.model.parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_state_dict_keys_are_unchanged(
    feature: str, launch: Callable[[Feature], Trained], plain: Trained
) -> None:
    assert state_keys(launch(FEATURES[feature])) == state_keys(plain)


# -- a DDP model, whose bucket all-reduces the microscope times -----------------------------


def test_a_ddp_model_copies_and_pickles_without_the_comm_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP keeps the timing hook in ``_comm_hooks``: a copy or a pickle gets torch's own."""
    monkeypatch.setenv("TIGHTROPE_MICROSCOPE", "every=1")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        losses = {}
        for watched in (False, True):
            model = make_model()
            wrapper = DistributedDataParallel(model)
            optimizer = make_optimizer(model)
            agent = (
                harness.attach(wrapper, optimizer, run_dir=tmp_path / "run") if watched else None
            )
            data = batches()
            losses[watched] = []
            for _ in range(3):
                loss = loss_of(wrapper, next(data))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses[watched].append(loss.detach())
            if agent is not None:
                assert agent.agent.microscope is not None
                assert agent.agent.microscope.comm.hooked_ddp  # the timer is in
                twin = copy.deepcopy(wrapper)
                assert not [h for h, _ in twin._comm_hooks if "harness" in h.__module__]
                # The model's own hooks pickle as Inert; of the timer, nothing.
                pickled = pickle.dumps(wrapper)
                assert b"comm_timing" not in pickled and b"CommTimer" not in pickled
                pickle.loads(pickled)
                loss_of(twin, next(data)).backward()  # the copy still trains
                agent.close()
        assert torch.equal(torch.stack(losses[True]), torch.stack(losses[False]))
        timed = read_microscope(tmp_path / "run").ranks[0].allreduce_ms
        assert np.all(timed[:3] > 0)  # and the timer still times the steps trained
    finally:
        end_gloo_group()


# -- tightrope exec --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exec_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """The support script run under ``tightrope exec`` with each exec feature."""
    root = tmp_path_factory.mktemp("exec")
    launched = {}
    for name, feature in EXEC_FEATURES.items():
        planned = []
        if feature.plan is not None:
            (root / f"{name}.json").write_text(json.dumps(feature.plan))  # YAML reads JSON
            planned = ["--plan", str(root / f"{name}.json")]
        cmd = [sys.executable, "-m", "harness", "exec", "--run-dir", str(root / name), *planned]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **feature.env}
        for absent in {*MICROSCOPE, *METRICS} - set(feature.env):
            env.pop(absent, None)
        launched[name] = subprocess.Popen(
            [*cmd, "--", sys.executable, str(SUPPORT)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, process in launched.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("feature", sorted(EXEC_FEATURES))
def test_the_model_survives_under_exec(
    feature: str, check: str, exec_results: dict[str, dict[str, object]]
) -> None:
    assert exec_results[feature][check] == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(EXEC_FEATURES))
def test_losses_are_bit_identical_under_exec(
    feature: str, exec_results: dict[str, dict[str, object]], plain: Trained
) -> None:
    assert exec_results[feature]["losses"] == [float(loss).hex() for loss in plain.losses]


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(EXEC_FEATURES))
def test_state_dict_keys_are_unchanged_under_exec(
    feature: str, exec_results: dict[str, dict[str, object]], plain: Trained
) -> None:
    assert exec_results[feature]["state_keys"] == state_keys(plain)


REPORTED = """\
import io, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
buffer = io.BytesIO()
torch.save(model, buffer)
buffer.seek(0)
again = torch.load(buffer, weights_only=False)
print("saved", len(buffer.getvalue()), again(torch.zeros(1, 4)).shape)
print("output hooks", sum(len(m._forward_hooks) for m in model.modules()))
"""


@pytest.mark.slow
def test_a_trainer_saving_its_whole_sequential_runs_under_exec_with_the_microscope(
    tmp_path: Path,
) -> None:
    """The reported crash: ``Can't pickle local object 'Microscope._output_hook...'``."""
    (tmp_path / "t.py").write_text(REPORTED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIGHTROPE_MICROSCOPE": "on"}
    done = subprocess.run(
        [sys.executable, "-m", "harness", "exec", "--run-dir", str(tmp_path / "run"), "--",
         sys.executable, str(tmp_path / "t.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    saved, hooks = done.stdout.splitlines()
    assert saved.startswith("saved ") and saved.endswith("torch.Size([1, 1])")
    assert int(hooks.split()[-1]) > 0, "the microscope was not on"


# -- negative controls: the checks catch a hook that breaks the trainer ----------------------


def _closure_hook(model: nn.Module) -> None:
    """A forward hook as the microscope had it: a local closure holding live state."""
    seen: list[int] = []

    def record(module: nn.Module, args: object, output: object) -> None:
        seen.append(1)

    model[0].register_forward_hook(record)  # type: ignore[index]


def _nudging_hook(model: nn.Module) -> None:
    """A forward hook that changes the output in its last bits."""

    def nudge(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output * (1 + 1e-6)

    model[0].register_forward_hook(nudge)  # type: ignore[index]


@pytest.mark.parametrize("check", ["torch_save", "pickle", "deepcopy"])
def test_a_closure_hook_is_caught(check: str) -> None:
    model = make_model()
    _closure_hook(model)
    trained = train(model, make_optimizer(model))
    # Pickling a local object raises AttributeError before Python 3.12, PicklingError after.
    with pytest.raises((AssertionError, AttributeError, pickle.PicklingError)):
        CHECKS[check](trained)


def test_a_hook_that_changes_the_numbers_is_caught(plain: Trained) -> None:
    model = make_model()
    _nudging_hook(model)
    trained = train(model, make_optimizer(model))
    assert not torch.equal(torch.stack(trained.losses), torch.stack(plain.losses))


@pytest.mark.parametrize("copy_of", ["torch_save", "pickle", "deepcopy"])
def test_a_copy_made_while_activations_overflow_carries_no_fault(
    tmp_path: Path, copy_of: str
) -> None:
    model = make_model()
    plan = FaultPlan.from_dict(
        {"faults": [{"kind": "activation_overflow", "at_step": 1, "target": "0", "factor": 1e4}]}
    )
    x = probe_input()
    with torch.no_grad():
        clean = model(x)
    with harness.attach(model, make_optimizer(model), run_dir=tmp_path, plan=plan) as agent:
        agent.open_step()  # step 1 opens: the fault's forward hook is on the first layer
        with torch.no_grad():
            assert not torch.equal(model(x), clean)  # the fault acts on the live model
        if copy_of == "torch_save":
            buffer = io.BytesIO()
            torch.save(model, buffer)
            assert b"faults" not in buffer.getvalue()
            twin = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
        elif copy_of == "pickle":
            twin = pickle.loads(pickle.dumps(model))
        else:
            twin = copy.deepcopy(model)
        assert not [h for h in hooks_of(twin) if live(h)]
        with torch.no_grad():
            assert torch.equal(twin(x), clean)  # the copy computes as if no fault were on
