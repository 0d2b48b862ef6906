"""The README's findings: one row per claim (C1-C8) with the verdict from its strongest evidence, the
effect in its unit and one plain sentence of what the verdict means, then what the evidence is and is
not, and how to read an effect of each kind of test. `normprop report` writes it between two marker
comments of the README.md beside the results directory (the repository's, for results/), from the
verdicts.csv files the report writes; every preset's verdicts in full are in REPORT.md."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pandas as pd

from normprop_cli import config, io, verdicts
from normprop_cli.report import Tree, ordered, results_trees, unmeasured
from normprop_cli.smoke import leave_out
from normprop_cli.statistics import format_ci, markdown

START, END = "<!-- verdicts:start -->", "<!-- verdicts:end -->"
# Strongest evidence first: the gpu preset trains at the paper's width, fashion on real images with the
# most epochs, cpu on digits with the most seeds; quick is a demonstration of the pipeline.
STRENGTH = ("gpu", "fashion", "cpu", "quick")
NAMES = {"fashion-mnist": "Fashion-MNIST", "digits": "digits", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
         "svhn": "SVHN"}  # fmt: skip
WRAP = 116


def read_verdicts(tree: Path) -> pd.DataFrame:
    return pd.read_csv(tree / "verdicts.csv", keep_default_na=False, na_values=[""])


# ---- one row's words ----------------------------------------------------------------------------------


def unit_of(claim: verdicts.Claim) -> str:
    """The effect's unit: the claim's own, or for a unitless effect what it is a difference of."""
    if claim.unit:
        return claim.unit
    if claim.metric.startswith("1 - "):
        return "(1 − ratio)"
    return "(band − largest deviation)" if claim.metric.startswith("band ") else ""


def _number(row: dict, key: str) -> float:
    return math.nan if row.get(key) is None else float(row[key])


def effect_text(row: dict, claim: verdicts.Claim) -> str:
    """'0.01 [-0.60, 0.63] pp'; '—' where no effect was measured."""
    effect, low, high = (_number(row, k) for k in ("effect", "ci_low", "ci_high"))
    if not math.isfinite(effect):
        return "—"
    return f"{format_ci(effect, low, high, digits=2 if claim.unit == 'pp' else 3)} {unit_of(claim)}"


def meaning(row: dict, claim: verdicts.Claim) -> str:
    """One plain sentence of what the verdict says, from a template per kind of test, and how firmly."""
    text = _sentence(row, claim)
    caveats = []
    flips, n = row.get("loso_flips"), row.get("n_seeds")
    if flips is not None and not pd.isna(flips) and int(flips) > 0:
        caveats.append(f"leaving one seed out changes the verdict in {int(flips)} of {int(n)} cases")
    if row.get("settled") is False or str(row.get("settled")) == "False":
        caveats.append("it changed over the last quarter of the epochs")
    if caveats and row["verdict"] != verdicts.INCONCLUSIVE:
        text = f"{text[:-1]}; fragile: {' and '.join(caveats)}."
    return text


def _sentence(row: dict, claim: verdicts.Claim) -> str:
    kind, verdict = claim.kind, row["verdict"]
    level = f"{verdicts.level_of(kind):.0%}"
    effect, low, high = (_number(row, k) for k in ("effect", "ci_low", "ci_high"))
    margin = _number(row, "margin")
    m = f"{margin:.2f} {claim.unit}".strip() if math.isfinite(margin) else "the margin"
    ratio = ""
    if claim.metric.startswith("1 - ") and math.isfinite(effect):
        ratio = f" (NormProp over the baseline: {format_ci(1 - effect, 1 - high, 1 - low, digits=2)})"
    if not math.isfinite(effect) or not math.isfinite(low):
        return "Undecided: the runs give no interval to judge (REPORT.md says why)."
    if verdict == verdicts.INCONCLUSIVE and row.get("halves") not in (None, verdicts.AGREE, verdicts.NO_HALVES):
        return f"Undecided: the two halves of the seeds point different ways ({row['halves']})."
    if kind == verdicts.SUPERIORITY:
        return {
            verdicts.REPRODUCED: f"Supported: the whole {level} interval lies above 0{ratio}.",
            verdicts.NOT_REPRODUCED: f"Contradicted: the whole {level} interval lies below 0, the other way{ratio}.",
        }.get(verdict, f"Undecided: the {level} interval includes 0{ratio}.")
    if kind == verdicts.NON_INFERIORITY:
        return {
            verdicts.REPRODUCED: f"Supported: NormProp is behind by less than the margin, {m}; the whole {level} "
            f"interval lies above -{m}.",
            verdicts.NOT_REPRODUCED: f"Contradicted: NormProp is behind by more than the margin, {m}; the whole "
            f"{level} interval lies below -{m}.",
        }.get(verdict, f"Undecided: the {level} interval includes -{m}.")
    if kind == verdicts.EQUIVALENCE:
        side = "above" if effect > 0 else "below"
        return {
            verdicts.REPRODUCED: f"Supported: the two settings differ by less than the margin; the whole {level} "
            f"interval lies within ±{m}.",
            verdicts.NOT_REPRODUCED: f"Contradicted: the two settings differ by more than ±{m} (the whole {level} "
            f"interval lies {side} it), whichever is better.",
        }.get(verdict, f"Undecided: the {level} interval crosses ±{m}.")
    return "Undecided: the claim has no test yet."


def device_name(tree: Path, experiment: str) -> str:
    """'NVIDIA H200' where the experiment's runs trained on a GPU, else 'CPU'."""
    for manifest in sorted((tree / experiment).glob("*/runs/*/manifest.json"))[:1]:
        name = json.loads(manifest.read_text()).get("device_name", "")
        if name.startswith("cuda"):
            return name.partition("(")[2].rstrip(")") or "GPU"
    return "CPU"


def evidence(tree: Tree, row: dict, claim: verdicts.Claim) -> str:
    """'fashion: Fashion-MNIST, width 0.25, 6 seeds, 8 epochs, CPU', from the row's budget."""
    parts = str(row.get("budget") or "").split(", ")
    if len(parts) != 6 or not parts[4].startswith("width "):  # not a trained run's (theory's: input, depth, seeds)
        return f"{tree.preset}: {', '.join(p for p in parts if p)}"
    dataset, _, epochs, seeds, width, _ = parts
    where = device_name(tree.path, claim.experiment)
    return f"{tree.preset}: {NAMES.get(dataset, dataset)}, width {_width(float(width[6:]))}, {seeds}, {epochs}, {where}"


def _width(width: float) -> str:
    """'1.0', '0.25'."""
    return f"{width:.1f}" if width == int(width) else f"{width:g}"


# ---- the block ----------------------------------------------------------------------------------------


def strongest(trees: list[Tree]) -> dict[str, tuple[Tree, dict]]:
    """Per claim, the tree and row of its strongest measured evidence (STRENGTH's order)."""
    rank = {p: i for i, p in enumerate(STRENGTH)}
    best: dict[str, tuple[Tree, dict]] = {}
    for tree in sorted(trees, key=lambda t: rank.get(t.preset, len(STRENGTH))):
        for row in tree.rows():
            if row["claim"] not in best and not unmeasured(row):
                best[row["claim"]] = (tree, row)
    return best


def found(best: dict[str, tuple[Tree, dict]]) -> str:
    """'Reproduced: C1 and C4. Not reproduced: C2. Inconclusive: C3.'"""
    out = []
    for verdict in (verdicts.REPRODUCED, verdicts.NOT_REPRODUCED, verdicts.INCONCLUSIVE):
        ids = sorted(c for c, (_, row) in best.items() if row["verdict"] == verdict)
        if ids:
            out.append(f"{verdict.capitalize()}: {', '.join(ids[:-1]) + ' and ' if len(ids) > 1 else ''}{ids[-1]}.")
    return " ".join(out)


def scope(trees: list[Tree]) -> str:
    """What the evidence is and is not: data sets, widths and devices, against the paper's."""
    claims = {c.id: c for c in verdicts.claims()}
    sets = sorted({NAMES.get(d, d) for t in trees for d in t.datasets()})
    paper_width = float(config.root("paper").model.width)
    at_paper_width, widths = [], set()
    for tree in trees:
        for row in tree.rows():
            for part in str(row.get("budget") or "").split(", "):
                if part.startswith("width ") and not unmeasured(row):
                    widths.add(width := float(part[6:]))
                    if width == paper_width:
                        device = device_name(tree.path, claims[row["claim"]].experiment)
                        where = f"{NAMES.get(row['dataset'], row['dataset'])}, {device}"
                        at_paper_width.append(f"the {tree.preset} preset's {row['claim']} ({where})")
    paper_sets = sorted({NAMES.get(d, d) for c in claims.values() for d in verdicts.paper_datasets(c.experiment)})
    missing = [d for d in paper_sets if d not in sets]
    narrow = sorted(w for w in widths if w != paper_width)
    text = f"The evidence: {' and '.join(sets)}, at width {', '.join(_width(w) for w in narrow)} of the NIN"
    text += f" (the paper's is {_width(paper_width)}), trained on CPUs"
    text += f"; at the paper's width only {' and '.join(at_paper_width)}." if at_paper_width else "."
    if missing:
        text += f" No verdict comes from {', '.join(missing[:-1]) + ' or ' if len(missing) > 1 else ''}{missing[-1]}"
        text += ", the paper's data sets."
    return text


def how_to_read() -> str:
    """How to read an effect of each kind of test, with the claims of each kind."""
    kinds = {}
    for c in verdicts.claims():
        kinds.setdefault(c.kind, []).append(c.id)
    parts = {
        verdicts.SUPERIORITY: "superiority ({ids}): above 0 favours the paper, reproduced when the 95% interval lies "
        "above 0",
        verdicts.NON_INFERIORITY: "non-inferiority ({ids}): NormProp's advantage over its baseline, reproduced when "
        "the 95% interval lies above minus the margin",
        verdicts.EQUIVALENCE: "equivalence ({ids}): the difference between two settings, reproduced when the 90% "
        "interval lies within plus or minus the margin, so a large effect of either sign is not",
    }
    texts = [parts[k].format(ids=", ".join(ids)) for k, ids in kinds.items() if k in parts]
    return "How to read an effect: " + "; ".join(texts) + "."


def block(results: Path) -> str:
    """The markdown between the markers."""
    results = Path(results)
    trees = [Tree(p, read_verdicts(p)) for p in results_trees(results) if (p / "verdicts.csv").exists()]
    trees, _ = leave_out(trees, results)
    trees = ordered(trees, results)
    best = strongest(trees)
    table = []
    for c in verdicts.claims():
        tree, row = best.get(c.id, (None, None))
        if row is None:
            table.append([f"{c.id}: {c.claim}", verdicts.NOT_MEASURED, "—", "No preset measured it.", "—"])
            continue
        table.append([f"{c.id}: {c.claim}", f"**{row['verdict']}**", effect_text(row, c), meaning(row, c),
                      evidence(tree, row, c)])  # fmt: skip
    order = ", then ".join(p for p in STRENGTH if any(t.preset == p for t in trees))
    report = f"{results.name}/REPORT.md"
    head = f"Each claim is judged on its strongest evidence ({order}). {found(best)}"
    quick = (
        "The quick preset (`make reproduce-all`'s default) is a quarter-hour demonstration of the pipeline on two "
        f"CPU cores; its verdicts are weak and may differ by CPU. [{report}]({report}): every preset's verdicts, "
        "margins, halves of the seeds and robustness checks."
    )
    paragraphs = [head, "", *markdown(table, ["claim", "verdict", "effect [interval]", "what it means", "evidence"])]
    for text in (scope(trees), how_to_read(), quick):
        paragraphs += ["", *textwrap.wrap(text, WRAP, break_on_hyphens=False)]
    paragraphs[0:1] = textwrap.wrap(head, WRAP, break_on_hyphens=False)
    return "\n".join(paragraphs)


def with_block(text: str, content: str) -> str:
    """`text` with what lies between the markers replaced by `content`."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README has no {START} ... {END} block")
    return f"{head}{START}\n{content}\n{END}{tail}"


def readme_of(results: Path) -> Path | None:
    """The README.md beside `results` that holds the markers, else None."""
    readme = Path(results).resolve().parent / "README.md"
    return readme if readme.exists() and START in readme.read_text() and END in readme.read_text() else None


def update(results: Path) -> Path | None:
    """Rewrite the README's block from `results`' verdicts.csv files; the README where that changed it,
    None where it did not (no README, no verdicts, or the block already says the same)."""
    readme = readme_of(results)
    if readme is None or not any((p / "verdicts.csv").exists() for p in results_trees(Path(results))):
        return None
    text = readme.read_text()
    new = with_block(text, block(results))
    if new == text:
        return None
    return io.write_text(readme, new)
