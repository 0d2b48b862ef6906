"""3. Proposition 1 (eq. 3, proof eq. 16-19): the exact min_alpha ||Sigma - diag(alpha)||_F against the
bound as printed and as corrected by the note's Appendix A (proposition1.csv)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig
from scipy.optimize import minimize

from normprop_cli.experiments.theory.common import normal


def prop1_matrix(structure: str, rho: float | None, norms: str, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """m x n weights: rows with a given coherence structure, then scaled to the given norms."""
    if structure == "glorot":  # section 4.2: row norms ~ sqrt(2n / (m + n)), left as they are
        a = math.sqrt(6.0 / (m + n))
        return rng.uniform(-a, a, (m, n))
    if structure == "gaussian":
        w = rng.standard_normal((m, n))
    elif structure == "orthonormal":  # coherence 0
        w = np.linalg.qr(rng.standard_normal((n, m)))[0].T
    else:  # "common": sqrt(rho) c + sqrt(1 - rho) g_i, all orthonormal: every cosine exactly rho
        q = np.linalg.qr(rng.standard_normal((n, m + 1)))[0].T
        w = math.sqrt(rho) * q[:1] + math.sqrt(1.0 - rho) * q[1:]
    target = rng.uniform(0.5, 1.5, m) if norms == "random" else np.full(m, float(norms))
    return w * (target / np.linalg.norm(w, axis=1))[:, None]


def prop1_row(w: np.ndarray, sigma: float, cov_x: np.ndarray) -> dict:
    m = w.shape[0]
    gram = w @ w.T
    sq = np.diag(gram).copy()  # ||W_i||^2
    off = gram - np.diag(sq)
    r = np.sqrt(sq)
    # eq. 18 done exactly: ||Sigma - diag(alpha)||_F^2
    #   = sigma^4 sum_{i != j} (W_i.W_j)^2 + sum_i (alpha_i - sigma^2 ||W_i||^2)^2
    exact = sigma**2 * math.sqrt((off**2).sum())
    mu = np.abs(off / np.outer(r, r)).max() if m > 1 else 0.0  # coherence
    pairs = sq.sum() ** 2 - (sq**2).sum()  # sum_{i != j} ||W_i||^2 ||W_j||^2
    radicand = (sq * (1 - sq)).sum() + m * (m - 1) * mu**2 * pairs  # eq. 3 / eq. 19 as printed
    # negative: undefined; within rounding of 0 (sum_i r_i^2 (1 - r_i^2) at r_i = 1): 0
    undefined = radicand < -1e-12 * (sq**2).sum()
    printed = math.nan if undefined else sigma**2 * math.sqrt(max(radicand, 0.0))
    corrected = sigma**2 * math.sqrt(m * (m - 1) * mu**2 * pairs)  # the note's Appendix A
    # the proof's own step (W_i.W_j)^2 <= mu^2 ||W_i||^2 ||W_j||^2 needs no extra m(m-1)
    coherence = sigma**2 * mu * math.sqrt(pairs)

    # cross-checks: minimise over alpha numerically; and the empirical covariance of samples
    cov = sigma**2 * gram  # eq. 17

    def objective(alpha):
        diff = cov - np.diag(alpha)
        return (diff**2).sum(), -2.0 * np.diag(diff)

    opt = minimize(objective, np.zeros(m), jac=True, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12})
    empirical = sigma**2 * (w @ cov_x @ w.T)
    fails = lambda bound: bool(bound < exact * (1 - 1e-9) - 1e-12)  # noqa: E731
    return {
        "m": m,
        "n": w.shape[1],
        "row_norm_min": r.min(),
        "row_norm_max": r.max(),
        "coherence": mu,
        "exact": exact,
        "exact_numerical": math.sqrt(max(opt.fun, 0.0)),
        "alpha_numerical_max_err": np.abs(opt.x - sigma**2 * sq).max(),
        "empirical": math.sqrt((empirical**2).sum() - (np.diag(empirical) ** 2).sum()),
        "printed_radicand": radicand,
        "printed_bound": printed,
        "corrected_bound": corrected,
        "coherence_bound": coherence,
        "printed_undefined": undefined,
        "printed_fails": False if undefined else fails(printed),
        "corrected_fails": fails(corrected),
        "coherence_bound_fails": fails(coherence),
    }


def proposition1_table(cfg: DictConfig) -> pd.DataFrame:
    t = cfg.theory
    n = int(t.prop1_n)
    # the covariance of samples x ~ N(0, I), one draw for every W: Sigma_hat = sigma^2 W cov_x W^T
    cov_x = torch.cov(normal((int(t.prop1_samples), n), cfg.seed + 2).T).numpy()
    cases = [("glorot", None, "glorot")]
    cases += [
        (s, rho, str(norm))
        for s, rho in [("gaussian", None), ("orthonormal", None)] + [("common", float(r)) for r in t.prop1_rhos]
        for norm in t.prop1_row_norms
    ]
    rows = []
    for m in (int(t.prop1_m), int(t.prop1_small_m)):
        for i, (structure, rho, norms) in enumerate(cases):
            rng = np.random.default_rng([cfg.seed, m, i])
            w = prop1_matrix(structure, rho, norms, m, n, rng)
            case = f"{structure}" + (f" rho={rho:g}" if rho is not None else "")
            rows.append(
                {"case": case, "structure": structure, "rho": rho, "row_norms": norms}
                | prop1_row(w, float(t.prop1_sigma), cov_x)
            )
    return pd.DataFrame(rows)
