"""A soak's two plots for the HTML scorecard: ETTR over time, and each fault's time to
recover at the time it struck, one colour per fault kind (inline SVG, as `plots`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.scorecard.render.plots import FAULTED, Plot, render_plot

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Marker of an incident by outcome: detected filled, missed hollow, latent a cross.
_MARKERS = {"detected": ("o", True), "missed": ("o", False), "latent": ("x", True)}


def soak_plots(metrics: dict[str, Any], id_prefix: str) -> list[Plot]:
    """ETTR so far against wall time (faults as ticks); MTTR of each fault by kind."""
    curve = [(float(t), float(e)) for t, e in metrics.get("ettr_curve") or []]
    incidents = [i for i in metrics.get("incidents") or [] if isinstance(i, dict)]
    plots = []
    if curve:

        def draw_ettr(ax: Axes) -> None:
            ax.plot(
                [t for t, _ in curve],
                [e for _, e in curve],
                color=FAULTED,
                lw=1.4,
                label="ETTR so far",
            )
            base = (metrics.get("baseline") or {}).get("ettr")
            if isinstance(base, int | float):
                ax.axhline(base, color="#a0a0a0", lw=1, ls="--", label="fault-free run")
            for n, i in enumerate(incidents):
                ax.axvline(
                    float(i["at"]),
                    color="#d62728",
                    lw=0.5,
                    alpha=0.35,
                    label="fault" if n == 0 else None,
                )
            ax.set_ylim(0, 1.05)

        plots.append(
            render_plot(
                f"{id_prefix}-ettr",
                "ETTR over time",
                "ETTR",
                (9.0, 3.2),
                draw_ettr,
                xlabel="seconds",
            )
        )
    timed = [i for i in incidents if isinstance(i.get("mttr"), int | float)]
    if timed:

        def draw_mttr(ax: Axes) -> None:
            for kind in sorted({str(i["kind"]) for i in timed}):
                mine = [i for i in timed if i["kind"] == kind]
                for outcome, (marker, filled) in _MARKERS.items():
                    some = [i for i in mine if i.get("outcome") == outcome]
                    if not some:
                        continue
                    dots = ax.scatter(
                        [float(i["at"]) for i in some],
                        [float(i["mttr"]) for i in some],
                        marker=marker,
                        s=22,
                        label=f"{kind} ({outcome})",
                    )
                    if not filled:
                        dots.set_facecolor("none")
                        dots.set_edgecolor(dots.get_edgecolor())
            ax.set_yscale("log")

        plots.append(
            render_plot(
                f"{id_prefix}-mttr",
                "Time to recover, by fault",
                "seconds",
                (9.0, 3.6),
                draw_mttr,
                xlabel="seconds into the soak",
            )
        )
    return plots
