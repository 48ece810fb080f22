"""Metrics for dashboards: what the agent journals, as OpenMetrics (docs/metrics.md).

Off by default. When on, every event the agent journals also updates a few figures (step,
loss, loss scale, faults injected, detections, recoveries, checkpoints saved, restarts,
the last step's time), and they go out as an OpenMetrics text file
(``RUN_DIR/metrics/rank-R.prom``, rewritten atomically at most every ``interval`` seconds
and once more at the end) and/or a Prometheus endpoint (`harness.inside.metrics_endpoint`,
``prometheus-client``). The figures are read from the very records the journal writes,
so they cannot disagree with it; a restarted process starts from its rank's earlier
journal, so the counters count the whole run, as the journal does.

A metrics failure never reaches the training step: a write or a bind that fails is
journaled once (`metrics_failed`) and training goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.errors import TightropeError
from harness.records.events import CheckpointSaved, Detected, FaultInjected, Recovered, StepObserved
from harness.records.journal import Event, JournalWriter
from harness.run_layout import RunLayout

#: ``1`` (or ``true``): write ``RUN_DIR/metrics/rank-R.prom``; any other value: a folder to
#: write ``rank-R.prom`` into (a node exporter's textfile folder, say).
ENV_FILE = "TIGHTROPE_METRICS_FILE"
#: Serve ``/metrics`` on this port plus the rank (0: a free port, see `Metrics.port`).
ENV_PORT = "TIGHTROPE_METRICS_PORT"
#: Address the endpoint binds (default 127.0.0.1: this host only).
ENV_ADDR = "TIGHTROPE_METRICS_ADDR"
#: Seconds between rewrites of the file (default 5).
ENV_INTERVAL = "TIGHTROPE_METRICS_INTERVAL"

Kind = Literal["gauge", "counter"]


class MetricsError(TightropeError):
    """A metrics setting that cannot be used (named in the message)."""


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """Where the agent's metrics go; neither ``file`` nor ``port``: nowhere."""

    #: The OpenMetrics text file of this rank.
    file: Path | None = None
    #: The endpoint's port (already offset by the rank); 0 picks a free one.
    port: int | None = None
    address: str = "127.0.0.1"
    #: Seconds between rewrites of the file.
    interval: float = 5.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and self.interval > 0):
            raise MetricsError(f"metrics.interval must be seconds > 0, got {self.interval!r}")
        if self.port is not None and not 0 <= self.port <= 65535:
            raise MetricsError(f"metrics.port must be 0 to 65535, got {self.port}")

    @property
    def enabled(self) -> bool:
        """True when the metrics go somewhere."""
        return self.file is not None or self.port is not None

    @classmethod
    def from_env(
        cls, run_dir: Path, rank: int, env: Mapping[str, str] | None = None
    ) -> MetricsOptions:
        """The options the ``TIGHTROPE_METRICS_*`` variables ask for (none set: off)."""
        env = os.environ if env is None else env
        file = None
        where = env.get(ENV_FILE, "").strip()
        if where:
            folder = RunLayout(run_dir).metrics if where.lower() in ("1", "true") else Path(where)
            file = folder / RunLayout(run_dir).metrics_file(rank).name
        port = None
        if text := env.get(ENV_PORT, "").strip():
            if not text.isdigit():
                raise MetricsError(f"{ENV_PORT} must be a port number, got {text!r}")
            port = int(text) + rank if int(text) else 0
        interval = 5.0
        if text := env.get(ENV_INTERVAL, "").strip():
            try:
                interval = float(text)
            except ValueError:
                raise MetricsError(f"{ENV_INTERVAL} must be seconds > 0, got {text!r}") from None
            if not (math.isfinite(interval) and interval > 0):
                raise MetricsError(f"{ENV_INTERVAL} must be seconds > 0, got {text!r}")
        address = env.get(ENV_ADDR, "").strip() or "127.0.0.1"
        return cls(file=file, port=port, address=address, interval=interval)


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: its name (without ``_total``), type, help and samples."""

    name: str
    kind: Kind
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


@dataclass(slots=True)
class _Figures:
    step: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    last_step_wall: float | None = None
    restarts: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    detections: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, int] = field(default_factory=dict)
    checkpoints: int = 0


class Metrics:
    """The figures of one rank, fed by its journal, written and served as OpenMetrics."""

    def __init__(self, options: MetricsOptions, rank: int) -> None:
        self.options = options
        self.rank = rank
        self._figures = _Figures()
        self._lock = threading.Lock()  # the endpoint's thread reads while training writes
        self._writing = threading.Lock()
        self._started = time.time()
        self._last_write = -math.inf
        self._journal: JournalWriter | None = None
        self._failed: set[str] = set()  # what failed and was journaled: file, port, count
        self._server: Any = None
        #: The port the endpoint listens on (None: no endpoint).
        self.port: int | None = None

    # -- fed by the journal ----------------------------------------------------------

    def replay(self, events: Iterable[Event]) -> None:
        """Count what this rank's earlier attempts journaled."""
        for e in events:
            if e.rank == self.rank:
                self._update(e.kind, e.step, e.restart, e.wall, e.fields)

    def observe(self, record: Mapping[str, Any]) -> None:
        """Count one record just journaled; rewrite the file when it is due. Never raises."""
        try:
            self._update(record["kind"], record["step"], record["restart"], record["wall"], record)
            final = record["kind"] == "run_end"
            if self.options.file is not None and (
                final or time.monotonic() - self._last_write >= self.options.interval
            ):
                self.write_file()
        except Exception as exc:  # a figure must never stop a step
            self._fail(exc)

    def _update(
        self, kind: str, step: int, restart: int, wall: float, fields: Mapping[str, Any]
    ) -> None:
        with self._lock:
            f = self._figures
            f.restarts = max(f.restarts, restart)
            if kind == StepObserved.kind:
                f.step, f.last_step_wall = step, wall
                f.loss = _number(fields.get("loss"))
                f.loss_scale = _number(fields.get("loss_scale"))
            elif kind == FaultInjected.kind:
                _count(f.faults, str(fields.get("fault")))
            elif kind == Detected.kind:
                _count(f.detections, str(fields.get("detector")))
            elif kind == Recovered.kind:
                _count(f.recoveries, str(fields.get("action")))
            elif kind == CheckpointSaved.kind:
                f.checkpoints += 1

    # -- out -------------------------------------------------------------------------

    def families(self, now: float | None = None) -> list[Family]:
        """Every family as it stands now (``now``: wall time, for the heartbeat's age)."""
        now = time.time() if now is None else now
        r = {"rank": str(self.rank)}
        with self._lock:
            f = self._figures
            last = f.last_step_wall
            out = [
                _gauge("tightrope_step", "Last optimizer step the rank journaled.", r, f.step),
                _gauge("tightrope_loss", "Training loss of that step.", r, f.loss),
                _gauge("tightrope_loss_scale", "fp16 loss scale of that step.", r, f.loss_scale),
                _gauge(
                    "tightrope_last_step_timestamp_seconds",
                    "Wall time the last step was journaled.",
                    r,
                    last,
                ),
                _gauge(
                    "tightrope_heartbeat_age_seconds",
                    "Seconds since the last step (since the agent started, before one).",
                    r,
                    now - (self._started if last is None else last),
                ),
                _gauge(
                    "tightrope_restarts", "Times the launcher restarted the workers.", r, f.restarts
                ),
                Family(
                    "tightrope_checkpoints_saved",
                    "counter",
                    "Checkpoints the trainer claimed saved.",
                    [(r, float(f.checkpoints))],
                ),
                _by(
                    "tightrope_faults_injected", "Fault injections journaled.", r, "fault", f.faults
                ),
                _by("tightrope_detections", "Detections claimed.", r, "detector", f.detections),
                _by("tightrope_recoveries", "Recoveries claimed.", r, "action", f.recoveries),
            ]
        return out

    def text(self, now: float | None = None) -> str:
        """The figures in the OpenMetrics text format, ``# EOF`` included."""
        return render_openmetrics(self.families(now))

    def write_file(self, *, wait: bool = False) -> None:
        """Rewrite the file atomically (a reader never sees half of it); ``wait``: after a
        write another thread is doing (else this one is left out)."""
        path = self.options.file
        # Another thread of the rank (a background checkpoint save) may be writing it now:
        # then this write is not needed, and waiting for it would slow a step.
        if path is None or not self._writing.acquire(blocking=wait):
            return
        self._last_write = time.monotonic()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(self.text())
            os.replace(tmp, path)
        except Exception as exc:
            self._fail(exc, path=str(path))
        finally:
            self._writing.release()

    def serve(self) -> None:
        """Start the endpoint, when asked for; a failure is journaled, never raised."""
        if self.options.port is None:
            return
        try:
            from harness.inside.metrics_endpoint import start_endpoint

            self._server, self.port = start_endpoint(self, self.options.address, self.options.port)
        except Exception as exc:
            self._fail(exc, port=self.options.port)

    def close(self) -> None:
        """The last write of the file, and the endpoint shut down."""
        if self.options.file is not None:
            self.write_file(wait=True)
        server, self._server = self._server, None
        if server is not None:
            try:
                server.shutdown()
                server.server_close()
            except Exception as exc:
                self._fail(exc, port=self.port or 0)

    def _fail(self, exc: BaseException, **where: Any) -> None:
        what = next(iter(where), "count")
        if what in self._failed:
            return
        self._failed.add(what)  # once each: a full disk must not fill the journal too
        journal = self._journal
        if journal is None:
            return
        step = self._figures.step or 0
        # The journal itself may be gone (closed, or its disk full): nothing to tell then.
        with contextlib.suppress(Exception):
            error = f"{type(exc).__name__}: {exc}"
            JournalWriter.emit(journal, "metrics_failed", step, error=error, **where)


class MeteredJournal(JournalWriter):
    """A journal writer that hands every record it writes to a `Metrics`."""

    def __init__(
        self, run_dir: str | os.PathLike[str], rank: int, restart: int, metrics: Metrics
    ) -> None:
        super().__init__(run_dir, rank=rank, restart=restart)
        self.metrics = metrics
        metrics._journal = self

    def emit(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        """Write the event, then count it."""
        record = super().emit(kind, step, **fields)
        self.metrics.observe(record)
        return record

    def close(self) -> None:
        """Write the metrics one last time, stop the endpoint, close the file."""
        self.metrics.close()
        super().close()


def render_openmetrics(families: Iterable[Family]) -> str:
    """``families`` in the OpenMetrics text format (counters' samples end in ``_total``)."""
    lines: list[str] = []
    for fam in families:
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        lines.append(f"# HELP {fam.name} {_escape(fam.help)}")
        suffix = "_total" if fam.kind == "counter" else ""
        for labels, value in fam.samples:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{fam.name}{suffix}{{{pairs}}} {_value(value)}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _gauge(name: str, help: str, labels: dict[str, str], value: float | None) -> Family:
    # No sample when there is no figure (no step yet, no loss scale in fp32).
    return Family(name, "gauge", help, [] if value is None else [(labels, float(value))])


def _by(name: str, help: str, base: dict[str, str], label: str, counts: dict[str, int]) -> Family:
    samples = [({**base, label: key}, float(n)) for key, n in sorted(counts.items())]
    return Family(name, "counter", help, samples)


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
