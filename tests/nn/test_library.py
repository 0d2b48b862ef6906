"""The layers as a library: `import normprop`, documented arguments, a forward of x alone,
NormPropLinear taking nn.Linear's arguments, errors that say what to do, and the README's NIN call."""

import inspect
import pydoc
import re
from pathlib import Path

import pytest
import torch

import normprop
import normprop_cli.nn as library
from normprop_cli.nn import JACOBIAN_MODES, NIN, NormPropConv2d, NormPropLinear, register_activation
from normprop_cli.nn import layers as layers_module
from normprop_cli.nn import nin as nin_module

README = Path(__file__).resolve().parents[2] / "README.md"


def library_section() -> str:
    text = README.read_text()
    return text.split("## Using the layers in your own model", 1)[1].split("\n## ", 1)[0]


def test_import_normprop_gives_every_public_name_of_the_library():
    assert set(library.__all__) <= set(normprop.__all__)
    for name in library.__all__:
        assert getattr(normprop, name) is getattr(library, name), name
    from normprop import NormPropConv2d as Conv  # the distribution's name imports

    assert Conv is NormPropConv2d


def test_the_readme_library_section_imports_normprop_and_its_code_runs():
    section = library_section()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert re.search(r"^from normprop import ", code, re.M) and "normprop_cli" not in code
    scope = {}
    exec(code, scope)  # the example builds its model and constrains it
    out = scope["model"](torch.randn(2, 1, 8, 8))  # the pooled head takes digits' 1x8x8 images
    assert out.shape == (2, 10)
    assert torch.isfinite(scope["loss"])
    assert "re-normalise" in section and "pool" in section  # the pooling advice is there
    assert "docs/library.md" in section  # the whole recipe, trained, is there


@pytest.mark.parametrize("cls", [NormPropConv2d, NormPropLinear])
def test_help_explains_normprops_own_arguments_and_pooling(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)  # what help(cls) prints
    for argument in ("activation", "jacobian", "prelu_init"):
        assert re.search(rf"^[\s|]*{argument}: \S", text, re.M), argument  # an entry for each argument
    assert all(f'"{mode}"' in text for mode in JACOBIAN_MODES)
    assert "register_activation" in text and "MaxPool2d" in text and "re-normalis" in text


@pytest.mark.parametrize("cls", [NormPropConv2d, NormPropLinear])
def test_forward_takes_the_input_and_by_keyword_alone_a_fold_made_for_it(cls):
    params = inspect.signature(cls.forward).parameters
    assert list(params) == ["self", "x", "fold"]
    assert params["fold"].kind is inspect.Parameter.KEYWORD_ONLY and params["fold"].default is None


def test_nin_still_folds_its_layers_at_once_through_the_hooks(monkeypatch):
    """One fold for all NormProp layers per forward (none alone), each layer called with its hooks,
    every layer's output fed by that one fold's autograd node, and no layer left holding anything of it."""
    model, twin = NIN(10, norm="normprop", width=0.1), NIN(10, norm="normprop", width=0.1)
    calls, seen = [], []
    fold = nin_module.fold_layers
    monkeypatch.setattr(nin_module, "fold_layers", lambda ls, r: calls.append(len(ls)) or fold(ls, r))
    monkeypatch.setattr(layers_module, "fold_layers", lambda ls, r: calls.append(-len(ls)) or fold(ls, r))
    for layer in model.hidden_layers():
        layer.register_forward_hook(lambda m, i, o: seen.append(fold_node(o)))
    out = model(torch.randn(2, 3, 32, 32))
    assert calls == [9] and len(seen) == 9 and seen[0] is not None and all(n is seen[0] for n in seen)
    pairs = zip(model.hidden_layers(), twin.hidden_layers(), strict=True)
    assert all(set(layer.__dict__) == set(fresh.__dict__) for layer, fresh in pairs)  # nothing left over
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def fold_node(t, depth=4):
    """The folded road's autograd node (`_FoldAllBackward`) among the first `depth` steps back from t, or None."""
    frontier = [t.grad_fn]
    for _ in range(depth):
        for node in frontier:
            if type(node).__name__ == "_FoldAllBackward":
                return node
        frontier = [n for node in frontier if node is not None for n, _ in node.next_functions if n is not None]
    return None


def test_nin_takes_norm_width_and_activation_in_the_readmes_order():
    model = NIN(10, 3, "normprop", 0.25, "tanh")
    assert (model.config.norm, model.config.width, model.config.activation) == ("normprop", 0.25, "tanh")
    assert NIN(10, 1, "batchnorm").config.norm == "batchnorm"
    assert NIN(10, 3, "none", 0.0625)(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ValueError, match="model.norm=nope is not known"):
        NIN(10, 3, "nope")
    assert re.search(r"NIN\(num_classes, in_channels, norm, width, activation", library_section())


def test_normproplinear_takes_bias_device_and_dtype_as_normpropconv2d_does():
    layer = NormPropLinear(6, 4, True, "cpu", torch.float64, activation="tanh")
    assert layer.weight.dtype == layer.gamma.dtype == layer.beta.dtype == torch.float64
    assert layer(torch.randn(3, 6, dtype=torch.float64)).dtype == torch.float64
    assert NormPropLinear(6, 4, device="meta").weight.is_meta
    conv, linear = inspect.signature(NormPropConv2d).parameters, inspect.signature(NormPropLinear).parameters
    for name in ("bias", "device", "dtype", "activation", "jacobian", "prelu_init"):
        assert (linear[name].kind, linear[name].default) == (conv[name].kind, conv[name].default), name
    for cls, args in ((NormPropLinear, (6, 4)), (NormPropConv2d, (6, 4, 3))):
        with pytest.raises(ValueError, match="bias=False is not NormProp"):
            cls(*args, bias=False)
    with pytest.raises(TypeError, match="by keyword"):
        NormPropLinear(6, 4, "tanh")  # the old positional activation is not taken for a bias


def test_an_unknown_activation_says_how_to_register_one():
    with pytest.raises(ValueError, match=r"unknown activation 'swish'.*register_activation\('swish'") as exc:
        NormPropConv2d(3, 4, 3, activation="swish")
    assert "\n" not in str(exc.value)
    register_activation("swish-test", torch.nn.functional.silu, breakpoints=())  # what the message proposes
    try:
        assert NormPropConv2d(3, 4, 3, activation="swish-test")(torch.randn(1, 3, 5, 5)).shape == (1, 4, 3, 3)
    finally:
        library.ACTIVATIONS.pop("swish-test")
