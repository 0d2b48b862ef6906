"""The configs ship inside the wheel: `normprop` works from an installed wheel, not only a checkout, and
`import normprop` (the distribution's name) gives the layers there."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_configs_and_composes_from_them(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
    )
    wheel = next((tmp_path / "dist").glob("normprop-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("normprop_cli/conf/") for n in names if n.startswith("normprop_cli/conf/")}
    in_repo = {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert in_repo <= shipped
    assert "normprop/__init__.py" in names
    # Install it apart from the checkout and compose a config there, away from the repository.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True
    )
    code = (
        "import normprop_cli, normprop_cli.config as c; "
        "cfg = c.load('table1', preset='paper', dataset='svhn'); "
        "print(normprop_cli.__file__); print(c.conf_dir()); print(cfg.train.epochs); "
        "import normprop; from normprop import NormPropConv2d; print(normprop.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == str(site / "normprop_cli" / "conf")
    assert out[2] == "25"  # SVHN's 25 epochs: the experiment_dataset group shipped too
    assert out[3] == str(site / "normprop" / "__init__.py")


def test_pyproject_declares_every_third_party_import():
    """Every top-level module the package imports that is neither the standard library nor its own is
    a declared dependency (by its distribution's name)."""
    import ast
    import re
    import tomllib

    distribution = {"sklearn": "scikit-learn", "hydra": "hydra-core", "yaml": "pyyaml"}  # import name -> distribution
    declared = {
        re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower()
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    imported = set()
    for path in [*(ROOT / "normprop_cli").rglob("*.py"), *(ROOT / "normprop").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"normprop", "normprop_cli", "__future__"}
    assert sorted(m for m in third_party if distribution.get(m, m).lower() not in declared) == []
