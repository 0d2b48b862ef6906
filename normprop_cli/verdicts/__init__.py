"""One verdict per claim of the paper (conf/claims.yaml), from the experiments' CSVs alone.

    table(results)          one row per claim (and data set) of one results tree, COLUMNS
    write_verdicts(results) <results>/verdicts.csv

Each claim has an effect oriented so that a positive effect favours the paper, a kind of test
(superiority, non-inferiority or equivalence), an interval over seeds at the kind's level (`level_of`:
90% for equivalence, 95% otherwise: a t interval on per-seed effects, or for C3's ratio of spreads
Bonett's interval, statistics.sd_ratio_interval) and a margin (a
fraction of a baseline's error where the claim says `relative_to`). `verdict` turns the interval into
reproduced / not reproduced / inconclusive; `judge` applies it to all seeds and to each half of them,
and `final_verdict` downgrades the all-seeds verdict where the halves disagree. REPORT.md's "How a
verdict is reached" says the same rule in words (`rule_text`).

rule.py      the claims, the rule and the estimates (the statistics)
measures.py  each claim's per-seed table from its experiment's CSVs (MEASURES)
sources.py   where the results are, how they were made, how that departs from the paper's protocol
tabulate.py  the table and verdicts.csv
divergence.py  how many runs of a sweep diverged, at which rates: a verdict "inconclusive: N of M runs diverged"
"""

from normprop_cli.verdicts.divergence import ALL_DIVERGED, Divergence, divergence, is_diverged_verdict
from normprop_cli.verdicts.measures import EARLY_EPOCHS, MEASURES, Measurement, NotMeasured, early_epochs
from normprop_cli.verdicts.rule import (
    AGREE,
    EQUIVALENCE,
    INCONCLUSIVE,
    NO_HALVES,
    NON_INFERIORITY,
    NOT_MEASURED,
    NOT_REPRODUCED,
    NOT_YET_MEASURED,
    OPPOSITE_VERDICTS,
    REPRODUCED,
    SUPERIORITY,
    Claim,
    Estimate,
    absolute_margin,
    claims,
    final_verdict,
    halves,
    halves_check,
    level_of,
    one_sample,
    paired,
    rule_text,
    side,
    threshold_text,
    verdict,
)
from normprop_cli.verdicts.sources import paper_datasets, paper_protocol, provenance, result_dirs
from normprop_cli.verdicts.tabulate import COLUMNS, judge, margin_of, table, write_verdicts

__all__ = [
    "AGREE",
    "ALL_DIVERGED",
    "COLUMNS",
    "EARLY_EPOCHS",
    "EQUIVALENCE",
    "INCONCLUSIVE",
    "MEASURES",
    "NO_HALVES",
    "NON_INFERIORITY",
    "NOT_MEASURED",
    "NOT_REPRODUCED",
    "NOT_YET_MEASURED",
    "OPPOSITE_VERDICTS",
    "REPRODUCED",
    "SUPERIORITY",
    "Claim",
    "Divergence",
    "Estimate",
    "Measurement",
    "NotMeasured",
    "absolute_margin",
    "claims",
    "divergence",
    "early_epochs",
    "final_verdict",
    "halves",
    "halves_check",
    "is_diverged_verdict",
    "judge",
    "level_of",
    "margin_of",
    "one_sample",
    "paired",
    "paper_datasets",
    "paper_protocol",
    "provenance",
    "result_dirs",
    "rule_text",
    "side",
    "table",
    "threshold_text",
    "verdict",
    "write_verdicts",
]
