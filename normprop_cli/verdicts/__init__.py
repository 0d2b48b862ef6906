"""SPEC §10: one verdict per claim of the paper (conf/claims.yaml), from the experiments' CSVs alone.

    table(results)          one row per claim (and data set) of one results tree, COLUMNS
    write_verdicts(results) <results>/verdicts.csv

Each claim has an effect oriented so that a positive effect favours the paper, a 95% interval over
seeds (scipy.stats: a t interval, or a bootstrap one) and a kind. `verdict` turns the interval into
reproduced / not reproduced / inconclusive; `judge` applies it to all seeds and to each half of them.
REPORT.md's "How a verdict is reached" says the same rule in words (`rule_text`).

rule.py      the claims, the rule and the estimates (the statistics)
measures.py  each claim's per-seed table from its experiment's CSVs (MEASURES)
sources.py   where the results are, how they were made, how that departs from the paper's protocol
tabulate.py  the table and verdicts.csv
"""

from normprop_cli.verdicts.measures import EARLY_EPOCHS, MEASURES, Measurement, NotMeasured, early_epochs
from normprop_cli.verdicts.rule import (
    INCONCLUSIVE,
    NON_INFERIORITY,
    NOT_MEASURED,
    NOT_REPRODUCED,
    NOT_YET_MEASURED,
    REPRODUCED,
    SUPERIORITY,
    Claim,
    Estimate,
    claims,
    final_verdict,
    halves,
    one_sample,
    paired,
    rule_text,
    verdict,
)
from normprop_cli.verdicts.sources import paper_datasets, paper_protocol, provenance, result_dirs
from normprop_cli.verdicts.tabulate import COLUMNS, judge, table, write_verdicts

__all__ = [
    "COLUMNS",
    "EARLY_EPOCHS",
    "INCONCLUSIVE",
    "MEASURES",
    "NON_INFERIORITY",
    "NOT_MEASURED",
    "NOT_REPRODUCED",
    "NOT_YET_MEASURED",
    "REPRODUCED",
    "SUPERIORITY",
    "Claim",
    "Estimate",
    "Measurement",
    "NotMeasured",
    "claims",
    "early_epochs",
    "final_verdict",
    "halves",
    "judge",
    "one_sample",
    "paired",
    "paper_datasets",
    "paper_protocol",
    "provenance",
    "result_dirs",
    "rule_text",
    "table",
    "verdict",
    "write_verdicts",
]
