"""The fault kinds that ship with tightrope: one table of (spec, injector), read by
`faults.registry.kinds`. A new kind is a module of its own plus one line here."""

from __future__ import annotations

from typing import Any

from faults.bitflip import BitflipInjector, BitflipSpec
from faults.checkpoint import (
    BitflipFileInjector,
    BitflipFileSpec,
    DeleteFileInjector,
    DeleteFileSpec,
    DeleteManifestInjector,
    DeleteManifestSpec,
    StaleLatestInjector,
    StaleLatestSpec,
    SwapInjector,
    SwapSpec,
    TruncateInjector,
    TruncateSpec,
    ZeroPageInjector,
    ZeroPageSpec,
)
from faults.collective import (
    CollectiveFailInjector,
    CollectiveFailSpec,
    CollectiveHangInjector,
    CollectiveHangSpec,
)
from faults.crash import (
    AbortInjector,
    AbortSpec,
    RankExceptionInjector,
    RankExceptionSpec,
    SegfaultInjector,
    SegfaultSpec,
)
from faults.data import DuplicateContaminationInjector, DuplicateContaminationSpec
from faults.gil import GilLockInjector, GilLockSpec
from faults.injector import Injector
from faults.loss_spike import BadBatchInjector, BadBatchSpec, LrSpikeInjector, LrSpikeSpec
from faults.node import NodeInjector, NodeKillSpec, NodePauseSpec, NodeStopSpec
from faults.numeric import (
    ActivationOverflowInjector,
    ActivationOverflowSpec,
    GradSpikeInjector,
    GradSpikeSpec,
    GradUnderflowInjector,
    GradUnderflowSpec,
    InfGradInjector,
    InfGradSpec,
    NanGradInjector,
    NanGradSpec,
)
from faults.oom import OomInjector, OomSpec
from faults.paraphrase import ParaphraseContaminationInjector, ParaphraseContaminationSpec
from faults.process import (
    HangInjector,
    HangSpec,
    KillInjector,
    KillSpec,
    PreemptInjector,
    PreemptSpec,
)
from faults.slow import SlowLinkInjector, SlowLinkSpec, StragglerInjector, StragglerSpec
from faults.spec import FaultSpec
from faults.tokenizer_stress import TokenizerStressInjector, TokenizerStressSpec
from faults.toxic import ToxicContaminationInjector, ToxicContaminationSpec

#: Every built-in kind, in the order `kinds()` gives them (the suite schema's order).
BUILTIN_KINDS: tuple[tuple[type[FaultSpec], type[Injector[Any]]], ...] = (
    # numeric
    (NanGradSpec, NanGradInjector),
    (InfGradSpec, InfGradInjector),
    (GradUnderflowSpec, GradUnderflowInjector),
    (GradSpikeSpec, GradSpikeInjector),
    (ActivationOverflowSpec, ActivationOverflowInjector),
    # loss spike
    (LrSpikeSpec, LrSpikeInjector),
    (BadBatchSpec, BadBatchInjector),
    # numeric: bit flips
    (BitflipSpec, BitflipInjector),
    # checkpoint
    (BitflipFileSpec, BitflipFileInjector),
    (TruncateSpec, TruncateInjector),
    (ZeroPageSpec, ZeroPageInjector),
    (DeleteFileSpec, DeleteFileInjector),
    (DeleteManifestSpec, DeleteManifestInjector),
    (StaleLatestSpec, StaleLatestInjector),
    (SwapSpec, SwapInjector),
    # data
    (DuplicateContaminationSpec, DuplicateContaminationInjector),
    (ParaphraseContaminationSpec, ParaphraseContaminationInjector),
    (TokenizerStressSpec, TokenizerStressInjector),
    (ToxicContaminationSpec, ToxicContaminationInjector),
    # process: whole nodes (Docker), then single ranks' processes
    (NodeKillSpec, NodeInjector),
    (NodeStopSpec, NodeInjector),
    (NodePauseSpec, NodeInjector),
    (KillSpec, KillInjector),
    (HangSpec, HangInjector),
    (PreemptSpec, PreemptInjector),
    # process: crashing, wedged and out-of-memory ranks (faults/crash.py, gil.py, oom.py)
    (RankExceptionSpec, RankExceptionInjector),
    (SegfaultSpec, SegfaultInjector),
    (AbortSpec, AbortInjector),
    (GilLockSpec, GilLockInjector),
    (OomSpec, OomInjector),
    # process: fail-slow ranks and broken collectives
    (StragglerSpec, StragglerInjector),
    (SlowLinkSpec, SlowLinkInjector),
    (CollectiveFailSpec, CollectiveFailInjector),
    (CollectiveHangSpec, CollectiveHangInjector),
)
