"""Verdicts under the earlier margins: where the kind and margin a claim is judged by now differ from those
in force when its first result was trained (git's account of conf/claims.yaml before the ledger began, the
ledger's "rule" entries after), the current runs and measure judged by both. A comparison beside the
verdict, not a verdict: the measure is today's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from normprop_cli.engine import ledger
from normprop_cli.statistics import markdown
from normprop_cli.verdicts import ledger as rules
from normprop_cli.verdicts.budgets import first_result, parse_time
from normprop_cli.verdicts.measures import MEASURES
from normprop_cli.verdicts.readings import NotMeasured
from normprop_cli.verdicts.rule import claims
from normprop_cli.verdicts.sources import provenance, result_dirs
from normprop_cli.verdicts.tabulate import judge

HEADING = "**Verdicts under the earlier margins**"


def in_force(fixed: rules.Fixed, tree: Path, at) -> tuple[dict, str] | None:
    """The kind and margin in force at `at` (where the claim had no rule yet, the first one it had after),
    and where that comes from; None where nothing says."""
    told = [(parse_time(g["date"]), g, f"git: commit {g['commit']}") for g in fixed.git_rules]
    told += [(parse_time(e["at"]), e, "recorded") for e in ledger.read(tree)
             if e.get("event") == rules.RULE and e["claim"] == fixed.claim]  # fmt: skip
    told = sorted((x for x in told if x[0] and at), key=lambda x: x[0])
    before = [x for x in told if x[0] <= at]
    if before and not before[-1][1].get("kind"):  # no rule yet then: the first one to judge these results
        before = [x for x in told if x[0] > at and x[1].get("kind")][:1]
    if not before:
        return None
    _, entry, where = before[-1]
    return {k: entry.get(k) for k in rules.RULE_FIELDS}, where


def rows(tree: Path) -> list[list[str]]:
    """claim | data set | kind and margin at the first result | verdict under them | now | verdict now."""
    by_id = {c.id: c for c in claims()}
    out = []
    for f in rules.fixed(tree):
        claim = by_id.get(f.claim)
        if claim is None or claim.id not in MEASURES:
            continue
        then = in_force(f, tree, first_result(tree, claim.experiment))
        current = {k: getattr(claim, k) for k in rules.RULE_FIELDS}
        if then is None or all(then[0].get(k) == current[k] for k in rules.RULE_FIELDS):
            continue
        earlier = replace(claim, **then[0])
        for sweep in result_dirs(tree, claim.experiment):
            prov = provenance(sweep)
            if f.dataset and prov.get("dataset", sweep.name) != f.dataset:
                continue
            try:
                m = MEASURES[claim.id](claim, sweep, prov)
            except NotMeasured:
                continue
            old, new = judge(earlier, m), judge(claim, m)
            out.append([claim.id, f.dataset or prov.get("dataset", sweep.name),
                        f"{text(then[0], old['margin'])} ({then[1]})", shown(old),
                        text(current, new["margin"]), shown(new)])  # fmt: skip
    return out


def text(fields: dict, margin: float) -> str:
    """'non-inferiority, m = 1 pp'; 'equivalence, m = 0.2 × the test error ... = 0.41'."""
    if not fields.get("kind") or (fields["kind"] == "superiority" and not fields.get("margin")):
        return str(fields.get("kind"))
    relative = f" × {fields['relative_to']} = {margin:.3g}" if fields.get("relative_to") else ""
    return f"{fields['kind']}, m = {float(fields.get('margin') or 0):g}{relative}"


def shown(judged: dict) -> str:
    return f"**{judged['verdict']}** (halves: {judged['verdict_half_a']} / {judged['verdict_half_b']})"


def section(tree: Path) -> list[str]:
    """The table, or nothing where every claim is judged by the kind and margin in force at its first result."""
    found = rows(tree)
    if not found:
        return []
    head = ["claim", "data set", "at the first result", "verdict then", "now", "verdict now"]
    return [f"{HEADING}: the current runs and measure judged by the kind and margin in force when the claim's "
            "first result was trained, beside the verdict by today's (the margins in pp, from the same runs).", "",
            *markdown(found, head), ""]  # fmt: skip
