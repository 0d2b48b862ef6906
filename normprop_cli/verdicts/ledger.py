"""What judged each verdict, recorded when it is first used: a claim's rule is its entry in conf/claims.yaml
and the version of its test. A test's version is declared in conf/claim_tests.yaml: its `id` (what the ledger
records) and the `source` it was declared for, a hash of the code of its measure (MEASURES) and of everything
in the verdicts' statistics that the measure and the rule (tabulate.judge) call, however deep. A change to that
code fails the suite until it is declared: a new `id` where the test now judges differently, a new `source`
alone where the code was only rewritten (the same verdicts from the same results, which the committed
reports' test checks). The report appends a "rule" entry to the tree's ledger (engine.ledger) the first time
it computes a verdict with a (claim, entry, test) it has not used on that tree's results before, with the
verdict it gave.

`fixed` reads the ledger back: for each claim, the rule in force now, when it was first used, the earlier
rules used on these results, and whether the current one came after the results it judges.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

from normprop_cli import config, io
from normprop_cli.engine import ledger
from normprop_cli.engine.runs import commit
from normprop_cli.verdicts.measures import MEASURES
from normprop_cli.verdicts.rule import NOT_MEASURED, NOT_YET_MEASURED
from normprop_cli.verdicts.tabulate import judge

RULE = "rule"
START = "start"
RULE_FIELDS = ("kind", "margin", "relative_to")
OURS = ("normprop_cli.verdicts", "normprop_cli.statistics")  # the modules whose code a test's version covers


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def entries() -> dict[str, dict]:
    """conf/claims.yaml's entries by claim, as written."""
    return dict((io.read_yaml(config.conf_dir() / "claims.yaml") or {}).get("claims") or {})


def _called(function) -> list:
    """The functions of OURS that `function`'s code names (its nested functions' too)."""
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names |= set(c.co_names)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    scope = getattr(function, "__globals__", {})
    found = [scope[n] for n in sorted(names) if callable(scope.get(n))]
    return [f for f in found if getattr(f, "__module__", "").startswith(OURS) and inspect.isfunction(f)]


TESTS = "claim_tests.yaml"  # in conf/: each claim's declared test version


def declared() -> dict[str, dict]:
    """conf/claim_tests.yaml: {claim: {"id": the version the ledger records, "source": its source_version}}."""
    return dict(io.read_yaml(config.conf_dir() / TESTS) or {})


def test_version(claim_id: str) -> str:
    """The claim's declared test version (conf/claim_tests.yaml's `id`); a claim not declared there, the hash of
    its code now (source_version)."""
    return str((declared().get(claim_id) or {}).get("id") or source_version(claim_id))


@lru_cache(maxsize=16)
def source_version(claim_id: str) -> str:
    """A hash of the source of the claim's measure and the rule (tabulate.judge), and of every function of
    the verdicts' statistics they call, however deep."""
    seen, todo = {}, [MEASURES[claim_id], judge] if claim_id in MEASURES else [judge]
    while todo:
        f = todo.pop()
        key = f"{f.__module__}.{f.__qualname__}"
        if key in seen:
            continue
        seen[key] = inspect.getsource(f)
        todo += _called(f)
    return digest("\n".join(f"{k}\n{seen[k]}" for k in sorted(seen)))


@lru_cache(maxsize=16)
def measure_version(claim_id: str) -> str | None:
    """A hash of the claim's measure function alone, as its module's text gives it (what git's account of
    the time before the ledger compares: the same function's text at each commit)."""
    function = MEASURES.get(claim_id)
    if function is None:
        return None
    text = Path(inspect.getsourcefile(function)).read_text()
    found = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function.__name__]
    return digest(ast.get_source_segment(text, found[0]) or "") if found else None


def rule_of(claim_id: str) -> dict:
    """{"entry": hash of its claims.yaml entry, "test": test_version, "measure": measure_version, kind, margin,
    relative_to}."""
    entry = entries().get(claim_id) or {}
    fields = {k: entry.get(k) for k in RULE_FIELDS}
    hashes = {"entry": digest(json.dumps(entry, sort_keys=True, default=str)), "test": test_version(claim_id)}
    return hashes | {"measure": measure_version(claim_id)} | fields


def record(tree: Path, frame: pd.DataFrame) -> list[dict]:
    """Append a "rule" entry for each measured verdict of the tree whose rule is not the last one the ledger
    has for that claim and data set (a new rule, or a return to an earlier one); the entries appended."""
    last = {(e.get("claim"), e.get("dataset")): (e.get("entry"), e.get("test")) for e in ledger.read(tree)
            if e.get("event") == RULE}  # fmt: skip
    added = []
    for row in frame.astype(object).where(frame.notna(), None).to_dict("records"):
        if row["verdict"] in (NOT_MEASURED, NOT_YET_MEASURED) or row.get("test") is None:  # no rule judged it
            continue
        rule = rule_of(row["claim"])
        if last.get((row["claim"], row["dataset"])) == (rule["entry"], rule["test"]):
            continue
        verdict = {k: row.get(k) for k in ledger.VERDICT_KEYS if k not in ("claim", "dataset")}
        added.append(ledger.append(tree, {"event": RULE, "claim": row["claim"], "dataset": row["dataset"],
                                          "commit": commit()} | rule | {"verdict": verdict}))  # fmt: skip
    return added


# ---- reading it back --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixed:
    """One claim on one data set of a tree: the rule now (the ledger's last "rule" entry for it), the other
    ones used on these results (each one's first use, oldest first), and git's account of its claims.yaml
    fields and of its measure from before the record began (the "start" entry)."""

    claim: str
    dataset: str
    now: dict
    earlier: tuple[dict, ...]
    git_rules: tuple[dict, ...]
    git_tests: tuple[dict, ...]


def start(tree: Path) -> dict | None:
    """The ledger's first "start" entry: where the record begins."""
    return next((e for e in ledger.read(tree) if e.get("event") == START), None)


def fixed(tree: Path) -> list[Fixed]:
    """Each claim and data set the tree's ledger has a rule for, with its rule's history, in claim order."""
    begun = start(tree) or {}
    git = begun.get("git") or {}
    by: dict[tuple[str, str], list[dict]] = {}
    for e in ledger.read(tree):
        if e.get("event") == RULE:
            by.setdefault((e["claim"], e.get("dataset") or ""), []).append(e)
    out = []
    for (claim, dataset), used in sorted(by.items()):
        now = used[-1]
        keys = {(now["entry"], now["test"])}
        earlier = []
        for e in used:
            if (e["entry"], e["test"]) not in keys:
                keys.add((e["entry"], e["test"]))
                earlier.append(e)
        out.append(Fixed(claim, dataset, now, tuple(earlier), tuple(git.get("rules", {}).get(claim, [])),
                         tuple(git.get("tests", {}).get(claim, []))))  # fmt: skip
    return sorted(out, key=lambda f: (int(f.claim[1:]) if f.claim[1:].isdigit() else 99, f.claim, f.dataset))
