"""normprop: Normalization Propagation (Arpit et al., ICML 2016).

`normprop_cli.nn` is the plain PyTorch layer library; the rest is the `normprop` command.
"""

__version__ = "0.1.0"
