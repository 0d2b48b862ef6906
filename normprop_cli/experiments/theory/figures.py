"""The theory experiment's four figures, drawn from its CSVs alone."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from normprop_cli.experiments.theory.common import published
from normprop_cli.experiments.theory.propagation import first_seed

MODE_COLORS = {"off": "C3", "divide": "C0", "init": "C2"}


def _fig_activation_stats(plt, tables, cfg):
    df = tables["activation_stats"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.15]})
    prelu = df[df["name"] == "prelu"].sort_values("param")
    for statistic, color in (("mean", "C0"), ("std", "C1"), ("jacobian_factor", "C2")):
        s = prelu[prelu["statistic"] == statistic]
        left.plot(s["param"], s["closed_form"], "-", color=color, label=f"{statistic} (Remark 2)")
        left.plot(s["param"], s["quadrature"], "o", mfc="none", color=color, ms=8)
        left.plot(s["param"], s["monte_carlo"], "x", color=color, ms=6)
    relu = df[df["name"] == "relu"]
    for _, r in relu.iterrows():
        left.plot(0.0, r["closed_form"], "*", color="k", ms=11, zorder=4)
    left.plot([], [], "o", mfc="none", color="0.3", label="quadrature")
    left.plot([], [], "x", color="0.3", label="Monte Carlo")
    left.plot([], [], "*", color="k", label="ReLU (Remark 1)")
    factor, where = published(cfg, "activation", "relu", "jacobian_factor")
    left.axhline(factor, color="0.5", ls=":", lw=1)
    left.text(
        left.get_xlim()[1],
        factor,
        f"{factor:g} ({where}) ",
        ha="right",
        va="bottom",
        fontsize=8,
        color="0.4",
    )
    left.set_xlabel("PReLU slope a")
    left.set_ylabel("statistic of PReLU_a(X), X ~ N(0, 1)")
    left.set_title("ReLU and PReLU: closed form, quadrature, Monte Carlo")
    left.legend(frameon=False, loc="lower left")

    rest = df[~df["name"].isin(["relu", "prelu"])].reset_index(drop=True)
    labels = [
        (f"dropout p={r['param']:g}, {r['name']}" if r["quantity"] == "dropout" else r["name"]) + f":  {r['statistic']}"
        for _, r in rest.iterrows()
    ]
    y = np.arange(len(rest))[::-1]
    right.scatter(rest["closed_form"], y, marker="|", s=300, color="k", label="closed form", zorder=3)
    right.scatter(
        rest["quadrature"],
        y,
        marker="o",
        s=45,
        facecolors="none",
        edgecolors="C0",
        label="quadrature",
        zorder=3,
    )
    right.scatter(rest["monte_carlo"], y, marker="x", s=30, color="C3", label="Monte Carlo", zorder=3)
    right.scatter(rest["published"], y, marker="D", s=18, color="0.6", label="printed (paper, note)")
    right.set_yticks(y, labels, fontsize=8)
    right.grid(axis="x", color="0.9")
    right.set_xlabel("value")
    right.set_title("tanh, sigmoid (eq. 12), pooling and dropout (note)")
    right.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4)
    fig.tight_layout()
    return fig


def _fig_jacobian(plt, tables, cfg):
    summary, hist = tables["jacobian"], tables["jacobian_histogram"]
    activations = list(dict.fromkeys(summary["activation"]))
    cols = 2 if len(activations) > 1 else 1
    rows = math.ceil(len(activations) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows + 0.8), squeeze=False)
    for ax, activation in zip(axes.flat, activations, strict=False):
        notes = []
        for mode, h in hist[hist["activation"] == activation].groupby("jacobian", sort=False):
            edges = np.append(h["bin_left"].to_numpy(), h["bin_right"].iloc[-1])
            color = MODE_COLORS.get(mode, "0.3")
            ax.stairs(h["count"].to_numpy(), edges, color=color, lw=1.5)
            this = (summary["activation"] == activation) & (summary["jacobian"] == mode)
            s = summary[this].iloc[0]
            ax.axvline(s["sv_rms"], color=color, lw=1.3)
            ax.axvline(s["predicted"], color=color, lw=1.3, ls="--")
            notes.append(f"{mode}: RMS {s['sv_rms']:.3f} (predicted {s['predicted']:.3f})")
        ax.text(
            0.98,
            0.97,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8.5,
            bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9},
        )
        ax.set_yscale("log")
        slope = s["slope"]
        ax.set_title(activation + (f" (slope a = {slope:g})" if pd.notna(slope) else ""))
        ax.set_xlabel("singular value of d o / d x")
        ax.set_ylabel("count")
    for ax in list(axes.flat)[len(activations) :]:
        ax.set_visible(False)
    handles = [
        plt.Line2D([], [], color=MODE_COLORS.get(m, "0.3"), lw=1.5, label=f"jacobian={m}")
        for m in dict.fromkeys(summary["jacobian"])
    ]
    handles += [
        plt.Line2D([], [], color="0.3", lw=1.3, label="RMS singular value (measured)"),
        plt.Line2D([], [], color="0.3", lw=1.3, ls="--", label="predicted, section 3.4"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    s0 = summary.iloc[0]
    fig.suptitle(
        f"Section 3.4: singular values of one NormProp layer's Jacobian\n"
        f"({int(s0['width'])} x {int(s0['width'])} Glorot W, "
        f"{int(s0['inputs'])} inputs x ~ N(0, I))"
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _fig_proposition1(plt, tables, cfg):
    df = tables["proposition1"]
    ms = list(dict.fromkeys(df["m"]))
    first = df[df["m"] == ms[0]]
    labels = [
        c if n == "glorot" else f"{c}, |W_i| = {n}" for c, n in zip(first["case"], first["row_norms"], strict=True)
    ]
    fig, axes = plt.subplots(
        1,
        len(ms),
        figsize=(6.0 * len(ms) + 1.5, 0.36 * len(first) + 2.2),
        sharey=True,
        squeeze=False,
    )
    bars = (
        ("exact", "k", "exact: min over alpha (eq. 18 with alpha*)"),
        ("printed_bound", "C3", "bound of eq. 3 as printed"),
        ("corrected_bound", "C0", "bound corrected by the note"),
        ("coherence_bound", "C2", "corrected, without the extra m(m-1)"),
    )
    height, zero = 0.2, 1e-9  # below `zero`: rounding of an exact 0
    for ax, m in zip(axes[0], ms, strict=True):
        g = df[df["m"] == m].reset_index(drop=True)
        y = np.arange(len(g))[::-1].astype(float)
        values = g[[b[0] for b in bars]].to_numpy(dtype=float)
        floor = values[np.isfinite(values) & (values > zero)].min() / 5
        for k, (column, color, label) in enumerate(bars):
            v = g[column].to_numpy(dtype=float)
            yy = y + (1.5 - k) * height
            ok = np.isfinite(v) & (v > zero)
            ax.barh(yy[ok], v[ok] - floor, left=floor, height=height, color=color, label=label)
            for i in np.flatnonzero(np.isfinite(v) & (v <= zero)):
                ax.text(floor, yy[i], " 0", va="center", fontsize=7, color=color)
        for i, r in g.iterrows():
            yy = y[i] + 0.5 * height
            if r["printed_undefined"]:
                ax.text(
                    floor,
                    yy,
                    " undefined: radicand < 0",
                    va="center",
                    fontsize=7,
                    color="C3",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
                )
            elif r["printed_fails"]:
                ax.plot(r["printed_bound"], yy, "*", color="C3", ms=12, zorder=4)
                ax.text(
                    r["printed_bound"],
                    yy,
                    "FAILS: below the exact value   ",
                    va="center",
                    ha="right",
                    fontsize=8,
                    color="C3",
                    fontweight="bold",
                    bbox={"facecolor": "white", "edgecolor": "C3", "pad": 1.5},
                )
            for column, flag, k in (
                ("corrected_bound", "corrected_fails", 2),
                ("coherence_bound", "coherence_bound_fails", 3),
            ):
                if r[flag]:
                    ax.plot(r[column], y[i] + (1.5 - k) * height, "*", color="C3", ms=12, zorder=4)
        ax.set_xscale("log")
        ax.set_xlim(left=floor)
        ax.set_yticks(y, labels, fontsize=8.5)
        ax.set_ylim(-0.7, len(g) - 0.3)
        ax.set_xlabel(f"||Sigma - diag(alpha)||_F  (sigma = {cfg.theory.prop1_sigma:g})")
        ax.set_title(f"m = {m} rows, n = {int(g['n'].iloc[0])} columns")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, frameon=False)
    fig.suptitle("Proposition 1: the canonical error bound against the exact error")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _fig_propagation(plt, tables, cfg):
    df = first_seed(tables["propagation"])
    nets = list(dict.fromkeys(df["net"]))
    fig, axes = plt.subplots(len(nets), 2, figsize=(12, 3.8 * len(nets)), squeeze=False)
    band = float(cfg.theory.band)
    for row, net in zip(axes, nets, strict=True):
        d = df[df["net"] == net]
        for (method, jacobian), g in d.groupby(["method", "jacobian"], sort=False, dropna=False):
            label = f"normprop, jacobian={jacobian}" if method == "normprop" else f"{method} (plain, Glorot)"
            color = MODE_COLORS.get(jacobian, "0.2") if method == "normprop" else "C1"
            for quantity, style in (("output", "-o"), ("pre_activation", ":")):
                q = g[g["quantity"] == quantity]
                for ax, stat in zip(row, ("mean", "std"), strict=True):
                    ax.plot(
                        q["layer"],
                        q[stat],
                        style,
                        color=color,
                        ms=3,
                        lw=1.4 if quantity == "output" else 1.0,
                        label=label if quantity == "output" else None,
                    )
        row[0].axhspan(-band, band, color="0.88", zorder=0)
        row[1].axhspan(1 - band, 1 + band, color="0.88", zorder=0)
        row[1].set_yscale("log")
        names = d.drop_duplicates("layer").sort_values("layer")
        for ax, stat in zip(row, ("mean", "std"), strict=True):
            ax.set_ylabel(f"{stat} over inputs and units")
            ax.set_title(f"{net.upper()}: {stat} of each layer (dotted: pre-activation)")
            if net == "nin":
                ax.set_xticks(names["layer"], names["name"], rotation=45, fontsize=8.5)
                # pooling: not re-normalised (section 3.2)
                for x in names.loc[names["kind"] == "pool", "layer"]:
                    ax.axvline(x, color="0.75", lw=0.8, ls="--", zorder=0)
            else:
                ax.set_xlabel("layer")
        row[0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


# stem of the figure's files -> draw(plt, tables, cfg) -> a matplotlib figure
FIGURES = {
    "activation_stats": _fig_activation_stats,
    "jacobian": _fig_jacobian,
    "proposition1": _fig_proposition1,
    "propagation": _fig_propagation,
}
