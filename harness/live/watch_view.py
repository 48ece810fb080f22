"""One frame of `tightrope watch`: a rich renderable built from a `Snapshot` alone (no
reading here), so a frame can be tested without a terminal."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.live import heatmap
from harness.live.hot_layers import HotLayer, from_layer_stats, from_microscope, hottest
from harness.live.watch_reader import RankState, Snapshot

_BARS = "▁▂▃▄▅▆▇█"
#: A rank silent this long is stale whatever its step time (the brief's 30 s).
STALE_MAX_S = 30.0
#: ... and one silent this many median step times, but never under STALE_MIN_S: a journal
#: write or a checkpoint between fast steps is not a hang.
STALE_STEPS = 10.0
STALE_MIN_S = 1.0
SPARK_WIDTH = 40


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as block characters, low to high; ``!`` where not finite."""
    values = values[-width:]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "!" * len(values)
    lo, hi = min(finite), max(finite)
    span = hi - lo
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        else:
            level = 0 if span == 0 else round((v - lo) / span * (len(_BARS) - 1))
            out.append(_BARS[level])
    return "".join(out)


def stale_after(median_step_time: float | None) -> float:
    """Seconds of silence after which a rank is shown as stale."""
    if median_step_time is None or not math.isfinite(median_step_time):
        return STALE_MAX_S
    return min(STALE_MAX_S, max(STALE_MIN_S, STALE_STEPS * median_step_time))


def lead_rank(snapshot: Snapshot, rank: int | None) -> int:
    """The rank whose steps are shown: the one asked for, else the lowest that stepped."""
    if rank is not None:
        return rank
    stepped = [r for r, s in snapshot.ranks.items() if s.last_step is not None]
    return min(stepped or snapshot.ranks or [0])


def _number(value: object, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, fmt)


def _headline(snapshot: Snapshot, rank: int) -> Text:
    if snapshot.ended:
        ends = [s.ended for s in snapshot.ranks.values() if s.ended is not None]
        statuses = sorted({str(e.get("status", "?")) for e in ends})
        if ends:
            state = f"ended ({', '.join(statuses)})"
        else:
            state = "ended (its background process is gone)"
        style = "bold green" if statuses == ["completed"] else "bold yellow"
    elif any(s.started is not None for s in snapshot.ranks.values()):
        state, style = "running", "bold cyan"
    else:
        state, style = "waiting for the job to start", "bold"
    text = Text.assemble(("tightrope watch ", "bold"), str(snapshot.run_dir), "  ")
    text.append(state, style)
    text.append(f"  (rank {rank} shown)", "dim")
    return text


def _step_table(state: RankState | None, rank: int) -> RenderableType:
    if state is None or state.last_step is None:
        return Text(f"rank {rank} has journaled no step yet", style="dim")
    e = state.last_step
    losses = [v for _, v in state.losses]
    loss = e.get("loss")
    loss_text = Text(_number(loss, ".4f"))
    if isinstance(loss, float) and not math.isfinite(loss):
        loss_text.stylize("bold red")
    rate = state.steps_per_second()
    grid = Table.grid(padding=(0, 2))
    for _ in range(6):
        grid.add_column()
    grid.add_row(
        Text.assemble(("step ", "dim"), (str(e.step), "bold")),
        Text.assemble(("loss ", "dim"), loss_text, " ", sparkline(losses)),
    )
    grid.add_row(
        Text.assemble(("lr ", "dim"), _number(e.get("lr"), ".3e")),
        Text.assemble(
            ("loss scale ", "dim"),
            _number(e.get("loss_scale"), "g"),
            ("   grad norm ", "dim"),
            _number(e.get("grad_norm"), ".4g"),
            ("   steps/s ", "dim"),
            _number(rate, ".2f"),
        ),
    )
    return grid


def hot_layers(snapshot: Snapshot, rank: int | None) -> tuple[str, list[HotLayer]]:
    """Where the per-layer figures came from, and the hottest layers in them."""
    if snapshot.microscope:
        return "microscope", hottest(from_microscope(snapshot.microscope, rank))
    if snapshot.layer_history:
        layers = from_layer_stats(snapshot.layer_history, snapshot.layer_stats_step, rank)
        return "layer_stats", hottest(layers)
    return "", []


def _layers_table(snapshot: Snapshot, rank: int | None) -> RenderableType:
    source, layers = hot_layers(snapshot, rank)
    if not source:
        return Text("hottest layers: no per-layer records", style="dim")
    table = Table(title=f"hottest layers (from the {source})", title_justify="left", box=None)
    for name in ("layer", "rank", "step", "grad norm", "its median", "x median", ""):
        table.add_column(name, justify="left" if name == "layer" else "right")
    for h in layers:
        ratio = "non-finite" if not h.finite else _number(h.ratio, ".1f") + "x"
        mark = Text("HOT", style="bold red") if h.hot else Text("")
        table.add_row(
            h.layer,
            str(h.rank),
            str(h.step),
            _number(h.latest, ".3g"),
            _number(h.median, ".3g"),
            ratio,
            mark,
            style="red" if h.hot else None,
        )
    if not any(h.hot for h in layers):
        table.caption = "no layer is at 3x its own median or above"
        table.caption_justify = "left"
    return table


def _heatmap(snapshot: Snapshot, rank: int | None, shown: int) -> RenderableType:
    """The rank asked for, else the one with the hottest layer, else the one shown above."""
    if rank is None:
        _, layers = hot_layers(snapshot, None)
        rank = layers[0].rank if layers else shown
    if snapshot.microscope:
        return heatmap.render(heatmap.from_microscope(snapshot.microscope, rank))
    return heatmap.render(heatmap.from_layer_stats(snapshot.layer_history, rank))


def _faults(snapshot: Snapshot) -> RenderableType:
    s = snapshot.status
    lines = [
        Text.assemble(("armed ", "yellow"), f"{a.fault} at step {a.step} ({a.id})") for a in s.armed
    ]
    lines += [
        Text.assemble(("fired ", "bold red"), f"{f.fault} at step {f.step} on rank {f.rank}")
        + (Text(f" -> {f.target}") if f.target else Text(""))
        for f in s.fired
    ]
    lines += [Text.assemble(("refused ", "dim"), f"{r.id}: {r.reason}") for r in s.rejected]
    if not lines:
        lines = [Text("faults: none armed, none fired", style="dim")]
    else:
        lines.insert(0, Text("faults", style="bold"))
    return Group(*lines)


def _heartbeats(snapshot: Snapshot) -> RenderableType:
    table = Table(title="heartbeat age per rank", title_justify="left", box=None)
    for name in ("rank", "last event", "heartbeat", "stale after", ""):
        table.add_column(name, justify="right" if name != "" else "left")
    ranks = sorted(set(snapshot.ranks) | set(snapshot.heartbeats))
    for r in ranks:
        state = snapshot.ranks.get(r)
        median = state.median_step_time() if state else None
        limit = stale_after(median)
        age = snapshot.now - state.last_wall if state and state.last_wall is not None else None
        beat = snapshot.heartbeats.get(r)
        beat_age = snapshot.now - beat.wall if beat else None
        ended = state is not None and state.ended is not None
        ages = [a for a in (age, beat_age) if a is not None]
        stale = not ended and bool(ages) and min(ages) > limit
        note = (
            Text("ended", style="dim")
            if ended
            else Text("STALE", "bold red")
            if stale
            else Text("")
        )
        beat_text = f"{beat_age:.1f} s (step {beat.step})" if beat and beat_age is not None else "-"
        table.add_row(
            str(r),
            f"{age:.1f} s" if age is not None else "-",
            beat_text,
            f"{limit:.1f} s",
            note,
            style="red" if stale else None,
        )
    if not ranks:
        return Text("heartbeats: no rank has written yet", style="dim")
    return table


def render(snapshot: Snapshot, rank: int | None = None) -> RenderableType:
    """The whole frame for ``snapshot``; ``rank`` picks whose steps and layers are shown."""
    shown = lead_rank(snapshot, rank)
    parts: list[RenderableType] = [
        _step_table(snapshot.ranks.get(shown), shown),
        Text(""),
        _layers_table(snapshot, rank),
        Text(""),
        _heatmap(snapshot, rank, shown),
        Text(""),
        _faults(snapshot),
        Text(""),
        _heartbeats(snapshot),
    ]
    if snapshot.torn:
        parts.append(Text(f"{snapshot.torn} unreadable journal line(s) skipped", style="yellow"))
    return Panel(Group(*parts), title=_headline(snapshot, shown), title_align="left")
