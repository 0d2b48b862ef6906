"""Hydra configs: find `conf/`, list its options, compose a run's config.

Data flows one way: Typer command -> this module -> experiment runner.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from normprop_cli.errors import UserError

GROUPS = ("experiment", "dataset", "model", "preset")


def conf_dir() -> Path:
    """`conf/` as shipped in the wheel (normprop_cli/conf) or beside the package in a checkout."""
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "conf", pkg.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise UserError(f"no Hydra configs found in {pkg / 'conf'} or {pkg.parent / 'conf'}; reinstall normprop")


def options(group: str) -> list[str]:
    """The choices of a config group, e.g. options('preset') -> ['paper', 'quick', 'smoke']."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def describe(group: str, name: str) -> str:
    """The first comment line of an option's YAML: what it is, in one line."""
    for line in (conf_dir() / group / f"{name}.yaml").read_text().splitlines():
        text = line.lstrip("# ").strip()
        if line.startswith("#") and text and not text.startswith("@package"):
            return text
    return ""


def check_choice(group: str, name: str) -> None:
    known = options(group)
    if name not in known:
        raise UserError(f"unknown {group} '{name}'; known: {', '.join(known)}")


def load(
    experiment: str,
    preset: str | None = None,
    dataset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **settings,
) -> DictConfig:
    """Compose the config of one experiment: root, experiment, preset, options, overrides.

    `settings` are the command's options (seeds=3, device='cpu', ...); None means not given.
    Trailing `overrides` win over everything, as on Hydra's own command line.
    """
    check_choice("experiment", experiment)
    given = [f"experiment={experiment}"]
    for group, name in (("preset", preset), ("dataset", dataset)):
        if name is not None:
            check_choice(group, name)
            given.append(f"{group}={name}")
    for key, value in settings.items():
        if value is not None:
            given.append(f"{key}={_override_value(value)}")
    given += list(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=given)
    except Exception as exc:  # Hydra's parse, missing-key and composition errors
        raise UserError(
            f"bad override ({_first_line(exc)}); write overrides as key=value, e.g. train.epochs=5"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    OmegaConf.set_struct(cfg, False)
    if cfg.experiment.get("methods") is not None and not cfg.get("grid"):
        cfg.grid = method_grid(cfg.experiment)
    return cfg


def method_grid(experiment: DictConfig) -> list[dict]:
    """The grid of an experiment that compares `methods` (nn.methods.METHODS) at `batch_sizes`: one
    setting <method>-b<batch size> each, at the rate `lr[i]` of its batch size times the method's
    `lr_scale` (default 1), the centre of its learning-rate sweep."""
    from normprop_cli.nn.methods import METHODS

    methods, sizes, rates = list(experiment.methods), list(experiment.batch_sizes), list(experiment.lr)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(
            f"experiment.methods: {', '.join(map(str, unknown))} not known; use some of {', '.join(METHODS)}"
        )
    if len(rates) != len(sizes) or not sizes:
        raise UserError(
            f"experiment.lr gives {len(rates)} rates for {len(sizes)} batch sizes ({sizes}); give one per batch size"
        )
    scale = experiment.get("lr_scale") or {}
    return [
        {"id": f"{m}-b{int(bs)}",
         "set": {f"model.{k}": v for k, v in METHODS[m].items()}
                | {"train.batch_size": int(bs), "train.lr": float(f"{float(lr) * float(scale.get(m, 1.0)):.6g}")}}
        for bs, lr in zip(sizes, rates, strict=True)
        for m in methods
    ]  # fmt: skip


def _override_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        text = str(value)
        return f"'{text}'" if any(c in text for c in " ,=[]{}'\"") else text
    return str(value)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
