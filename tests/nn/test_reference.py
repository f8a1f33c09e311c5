"""Published checkpoints: reference-named state dicts load into Transolver and convert back exactly.

The state dicts are built here from the documented names and shapes (no download), with
temperatures far outside ``[0.1, 5]``; the reference models are written here from the published
equations and read those state dicts by their reference names, so names, shapes and computation are
checked together.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshshard.nn import Transolver

C, H, M, L, IN, OUT, RATIO = 12, 3, 5, 3, 4, 2, 2
D = C // H


def _lin(x, sd, p, bias=True):
    y = x @ sd[f"{p}.weight"].T
    return y + sd[f"{p}.bias"] if bias else y


def _ln(x, sd, p):
    return F.layer_norm(x, (x.shape[-1],), sd[f"{p}.weight"], sd[f"{p}.bias"], 1e-5)


def _rand(gen, *shape, scale=0.3):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _temperatures(gen, shape):
    """Positive temperatures spread over [0.005, 60]: far outside the old clamp [0.1, 5]."""
    return torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(-5.3, 4.1, generator=gen))


# -- thuml -------------------------------------------------------------------------------------------
def _thuml_state_dict(plus: bool, cond: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict with thuml's names and shapes (Transolver ``Model`` / Transolver++ ``Model``)."""
    g = torch.Generator().manual_seed(seed)
    sd = {
        "preprocess.linear_pre.0.weight": _rand(g, 2 * C, IN), "preprocess.linear_pre.0.bias": _rand(g, 2 * C),
        "preprocess.linear_post.weight": _rand(g, C, 2 * C), "preprocess.linear_post.bias": _rand(g, C),
        "placeholder": _rand(g, C),
    }
    if plus and cond:
        sd |= {"embedding.weight": _rand(g, C, 3), "embedding.bias": _rand(g, C)}
    for i in range(L):
        b, a = f"blocks.{i}", f"blocks.{i}.Attn"
        sd |= {f"{b}.ln_1.weight": 1 + _rand(g, C), f"{b}.ln_1.bias": _rand(g, C)}
        if plus:
            sd |= {
                f"{a}.bias": _temperatures(g, (1, H, 1, 1)),
                f"{a}.proj_temperature.0.weight": _rand(g, M, D), f"{a}.proj_temperature.0.bias": _rand(g, M),
                f"{a}.proj_temperature.2.weight": _rand(g, 1, M), f"{a}.proj_temperature.2.bias": _rand(g, 1),
            }
        else:
            sd |= {f"{a}.temperature": _temperatures(g, (1, H, 1, 1))}
            sd |= {f"{a}.in_project_fx.weight": _rand(g, C, C), f"{a}.in_project_fx.bias": _rand(g, C)}
        sd |= {
            f"{a}.in_project_x.weight": _rand(g, C, C), f"{a}.in_project_x.bias": _rand(g, C),
            f"{a}.in_project_slice.weight": _rand(g, M, D, scale=1.0), f"{a}.in_project_slice.bias": _rand(g, M),
            f"{a}.to_q.weight": _rand(g, D, D), f"{a}.to_k.weight": _rand(g, D, D), f"{a}.to_v.weight": _rand(g, D, D),
            f"{a}.to_out.0.weight": _rand(g, C, C), f"{a}.to_out.0.bias": _rand(g, C),
            f"{b}.ln_2.weight": 1 + _rand(g, C), f"{b}.ln_2.bias": _rand(g, C),
            f"{b}.mlp.linear_pre.0.weight": _rand(g, RATIO * C, C), f"{b}.mlp.linear_pre.0.bias": _rand(g, RATIO * C),
            f"{b}.mlp.linear_post.weight": _rand(g, C, RATIO * C), f"{b}.mlp.linear_post.bias": _rand(g, C),
        }
    last = f"blocks.{L - 1}"
    sd |= {f"{last}.ln_3.weight": 1 + _rand(g, C), f"{last}.ln_3.bias": _rand(g, C)}
    sd |= {f"{last}.mlp2.weight": _rand(g, OUT, C), f"{last}.mlp2.bias": _rand(g, OUT)}
    return sd


def _thuml_attention(sd, a, x, plus):
    """``Physics_Attention_Irregular_Mesh`` / ``Physics_Attention_1D_Eidetic`` (eval: no noise)."""
    b, n, _ = x.shape
    x_mid = _lin(x, sd, f"{a}.in_project_x").reshape(b, n, H, D).permute(0, 2, 1, 3)  # B H N D
    if plus:
        hidden = F.gelu(_lin(x_mid, sd, f"{a}.proj_temperature.0"))
        tau = (F.gelu(_lin(hidden, sd, f"{a}.proj_temperature.2")) + sd[f"{a}.bias"]).clamp(min=0.01)
        fx_mid = x_mid
    else:
        tau = sd[f"{a}.temperature"]
        fx_mid = _lin(x, sd, f"{a}.in_project_fx").reshape(b, n, H, D).permute(0, 2, 1, 3)
    w = torch.softmax(_lin(x_mid, sd, f"{a}.in_project_slice") / tau, dim=-1)  # B H N G
    token = torch.einsum("bhnc,bhng->bhgc", fx_mid, w) / (w.sum(2) + 1e-5)[..., None]
    q, k, v = (token @ sd[f"{a}.to_{t}.weight"].T for t in "qkv")
    attn = torch.softmax(q @ k.transpose(-1, -2) * D**-0.5, dim=-1)
    out = torch.einsum("bhgc,bhng->bhnc", attn @ v, w).permute(0, 2, 1, 3).reshape(b, n, C)
    return _lin(out, sd, f"{a}.to_out.0")


def _thuml_model(sd, x, condition=None):
    plus = "blocks.0.Attn.bias" in sd
    fx = _lin(F.gelu(_lin(x, sd, "preprocess.linear_pre.0")), sd, "preprocess.linear_post") + sd["placeholder"]
    if condition is not None:
        fx = fx + _lin(condition, sd, "embedding").unsqueeze(1)
    for i in range(L):
        b = f"blocks.{i}"
        fx = _thuml_attention(sd, f"{b}.Attn", _ln(fx, sd, f"{b}.ln_1"), plus) + fx
        fx = _lin(F.gelu(_lin(_ln(fx, sd, f"{b}.ln_2"), sd, f"{b}.mlp.linear_pre.0")), sd, f"{b}.mlp.linear_post") + fx
    return _lin(_ln(fx, sd, f"blocks.{L - 1}.ln_3"), sd, f"blocks.{L - 1}.mlp2")


# -- PhysicsNeMo ---------------------------------------------------------------------------------------
def _physicsnemo_state_dict(plus: bool, seed: int = 1) -> dict[str, torch.Tensor]:
    """PhysicsNeMo ``Transolver(use_te=False)`` names and shapes, irregular mesh."""
    thuml = _thuml_state_dict(plus, cond=False, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    sd = {
        "preprocess.layers.0.weight": thuml["preprocess.linear_pre.0.weight"],
        "preprocess.layers.0.bias": thuml["preprocess.linear_pre.0.bias"],
        "preprocess.layers.2.weight": thuml["preprocess.linear_post.weight"],
        "preprocess.layers.2.bias": thuml["preprocess.linear_post.bias"],
    }
    for i in range(L):
        b, a = f"blocks.{i}", f"blocks.{i}.Attn"
        sd |= {f"{b}.ln_1.weight": thuml[f"{b}.ln_1.weight"], f"{b}.ln_1.bias": thuml[f"{b}.ln_1.bias"]}
        sd[f"{a}.temperature"] = _temperatures(g, (1, 1, H, 1))
        names = ["in_project_x.weight", "in_project_x.bias", "in_project_slice.weight", "in_project_slice.bias"]
        names += [f"proj_temperature.{j}.{p}" for j in (0, 2) for p in ("weight", "bias")] if plus else [
            "in_project_fx.weight", "in_project_fx.bias"]
        sd |= {f"{a}.{n}": thuml[f"{a}.{n}"] for n in names}
        sd[f"{a}.qkv_project.weight"] = _rand(g, 3 * D, D)
        sd |= {f"{a}.out_linear.{p}": thuml[f"{a}.to_out.0.{p}"] for p in ("weight", "bias")}
        sd |= {f"{b}.ln_mlp1.0.weight": thuml[f"{b}.ln_2.weight"], f"{b}.ln_mlp1.0.bias": thuml[f"{b}.ln_2.bias"]}
        for j, ref in ((0, "linear_pre.0"), (2, "linear_post")):
            for p in ("weight", "bias"):
                sd[f"{b}.ln_mlp1.1.layers.{j}.{p}"] = thuml[f"{b}.mlp.{ref}.{p}"]
    last = f"blocks.{L - 1}"
    for j, ref in ((0, "ln_3"), (1, "mlp2")):
        for p in ("weight", "bias"):
            sd[f"{last}.ln_mlp2.{j}.{p}"] = thuml[f"{last}.{ref}.{p}"]
    return sd


def _physicsnemo_attention(sd, a, x, plus):
    """PhysicsNeMo's ``PhysicsAttentionIrregularMesh`` (SDPA path), written out."""
    b, n, _ = x.shape
    x_mid = _lin(x, sd, f"{a}.in_project_x").reshape(b, n, H, D)  # B N H D
    fx_mid = x_mid if plus else _lin(x, sd, f"{a}.in_project_fx").reshape(b, n, H, D)
    proj = _lin(x_mid, sd, f"{a}.in_project_slice")  # B N H S
    temp = sd[f"{a}.temperature"]
    if plus:
        hidden = F.gelu(_lin(fx_mid, sd, f"{a}.proj_temperature.0"))
        tau = (temp + F.gelu(_lin(hidden, sd, f"{a}.proj_temperature.2"))).clamp(min=0.01)
        w = torch.softmax(proj / tau, dim=-1)
    else:
        w = torch.softmax(proj / temp.clamp(0.5, 5), dim=-1)
    normed = w / (w.sum(1) + 1e-2)[:, None]
    token = normed.permute(0, 2, 3, 1) @ fx_mid.permute(0, 2, 1, 3)  # B H S D
    qkv = (token @ sd[f"{a}.qkv_project.weight"].T).reshape(b, H, M, 3, D)
    q, k, v = qkv.unbind(3)
    out = F.scaled_dot_product_attention(q, k, v)
    y = torch.einsum("bths,bhsd->bthd", w, out).reshape(b, n, C)
    return _lin(y, sd, f"{a}.out_linear")


def _physicsnemo_model(sd, x):
    plus = "blocks.0.Attn.proj_temperature.0.weight" in sd
    fx = _lin(F.gelu(_lin(x, sd, "preprocess.layers.0")), sd, "preprocess.layers.2")
    for i in range(L):
        b = f"blocks.{i}"
        fx = _physicsnemo_attention(sd, f"{b}.Attn", _ln(fx, sd, f"{b}.ln_1"), plus) + fx
        h = _ln(fx, sd, f"{b}.ln_mlp1.0")
        fx = _lin(F.gelu(_lin(h, sd, f"{b}.ln_mlp1.1.layers.0")), sd, f"{b}.ln_mlp1.1.layers.2") + fx
    return _lin(_ln(fx, sd, f"blocks.{L - 1}.ln_mlp2.0"), sd, f"blocks.{L - 1}.ln_mlp2.1")


TOL = dict(rtol=1e-9, atol=1e-11)


def _x(batch=2, n=23, seed=5):
    return torch.randn(batch, n, IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _check_config(model, variant, cond_dim=None):
    cfg = model.config
    assert (cfg["in_dim"], cfg["out_dim"], cfg["n_hidden"], cfg["n_layers"], cfg["n_head"], cfg["slice_num"]) == (
        IN, OUT, C, L, H, M)
    assert cfg["mlp_ratio"] == RATIO and cfg["variant"] == variant and cfg["cond_dim"] == cond_dim
    assert next(model.parameters()).dtype == torch.float64


@pytest.mark.parametrize("plus", [False, True])
def test_thuml_round_trip_and_outputs(plus):
    sd = _thuml_state_dict(plus)
    model = Transolver.from_reference(sd, source="thuml").eval()
    _check_config(model, "plus" if plus else "plain", 3 if plus else None)
    back = model.reference_state_dict("thuml")
    assert sorted(back) == sorted(sd)
    for k in sd:
        torch.testing.assert_close(back[k], sd[k], rtol=0, atol=0, msg=k)
    x = _x()
    torch.testing.assert_close(model(x), _thuml_model(sd, x), **TOL)
    if plus:
        cond = torch.randn(2, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
        torch.testing.assert_close(model(x, cond), _thuml_model(sd, x, cond), **TOL)
    # a DDP-saved checkpoint ("module." prefix) loads the same
    ddp = Transolver.from_reference({f"module.{k}": v for k, v in sd.items()}, source="thuml").eval()
    torch.testing.assert_close(ddp(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("plus", [False, True])
def test_thuml_gradients_match_for_temperatures_outside_the_old_clamp(plus):
    sd = {k: v.clone().requires_grad_() for k, v in _thuml_state_dict(plus, seed=3).items()}
    model = Transolver.from_reference({k: v.detach() for k, v in sd.items()}, source="thuml").eval()
    x = _x(seed=6)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    _thuml_model(sd, xr).pow(2).mean().backward()
    model(xo).pow(2).mean().backward()
    torch.testing.assert_close(xo.grad, xr.grad, **TOL)
    grads = Transolver.from_reference(sd, source="thuml")  # a model holding the gradients as weights
    grads.load_state_dict({k: torch.zeros_like(p) if p.grad is None else p.grad for k, p in model.named_parameters()})
    mapped = grads.reference_state_dict("thuml")
    for k, v in sd.items():
        if v.grad is None:  # the condition embedding: unused without a condition
            assert k.startswith("embedding.")
            continue
        torch.testing.assert_close(mapped[k], v.grad, **TOL, msg=k)


@pytest.mark.parametrize("plus", [False, True])
def test_physicsnemo_round_trip_and_outputs(plus):
    sd = _physicsnemo_state_dict(plus)
    model = Transolver.from_reference(sd, source="physicsnemo").eval()
    _check_config(model, "plus" if plus else "plain")
    assert model.config["eps"] == 1e-2
    assert model.config["temperature_range"] == (None if plus else (0.5, 5.0))
    back = model.reference_state_dict("physicsnemo")
    assert sorted(back) == sorted(sd)
    for k in sd:
        torch.testing.assert_close(back[k], sd[k], rtol=0, atol=0, msg=k)
    x = _x(seed=7)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yo = _physicsnemo_model(sd, xr), model(xo)
    torch.testing.assert_close(yo, yr, **TOL)
    yr.pow(2).mean().backward()
    yo.pow(2).mean().backward()
    torch.testing.assert_close(xo.grad, xr.grad, **TOL)


def test_physicsnemo_export_folds_the_placeholder_into_the_preprocessing_bias():
    torch.manual_seed(0)
    model = Transolver(IN, OUT, C, L, H, M, RATIO, eps=1e-2, temperature_range=(0.5, 5.0)).double().eval()
    sd = model.reference_state_dict("physicsnemo")
    x = _x(seed=8)
    torch.testing.assert_close(_physicsnemo_model(sd, x), model(x), **TOL)
    again = Transolver.from_reference(sd, source="physicsnemo").eval()
    torch.testing.assert_close(again.placeholder, torch.zeros(C, dtype=torch.float64))
    torch.testing.assert_close(again(x), model(x), **TOL)


def test_export_of_a_model_the_reference_cannot_represent_raises():
    model = Transolver(IN, OUT, C, L, H, M, RATIO)
    with pytest.raises(ValueError, match=r"the physicsnemo model computes with \{'eps': 0.01, 'temperature_range'"):
        model.reference_state_dict("physicsnemo")
    clamped = Transolver(IN, OUT, C, L, H, M, RATIO, temperature_range=(0.1, 5.0))
    with pytest.raises(ValueError, match=r"this model with \{'temperature_range': \(0.1, 5.0\)\}"):
        clamped.reference_state_dict("thuml")
    with pytest.raises(ValueError, match=r"source must be one of \('thuml', 'physicsnemo'\) \(got 'nemo'\)"):
        model.reference_state_dict("nemo")
    plus = Transolver(IN, OUT, C, L, H, M, RATIO, variant="plus")
    sd = plus.reference_state_dict("thuml")  # the reference's always-present condition embedding: zeros
    assert torch.equal(sd["embedding.weight"], torch.zeros(C, 3))


def test_bad_reference_state_dicts_are_named():
    sd = _thuml_state_dict(False)
    with pytest.raises(ValueError, match=r"unexpected names in the thuml state dict: \['blocks.0.Attn.extra'\]"):
        Transolver.from_reference({**sd, "blocks.0.Attn.extra": torch.zeros(1)}, source="thuml")
    missing = {k: v for k, v in sd.items() if k != "blocks.1.Attn.to_k.weight"}
    with pytest.raises(ValueError, match=r"the thuml state dict lacks \['blocks.1.Attn.to_k.weight'\]"):
        Transolver.from_reference(missing, source="thuml")
    wrong = {**sd, "blocks.2.Attn.to_q.weight": torch.zeros(D + 1, D, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"shapes disagree .*to_q.weight: \(5, 4\) \(expected \(4, 4\)\)"):
        Transolver.from_reference(wrong, source="thuml")
    with pytest.raises(ValueError, match="not a physicsnemo Transolver state dict: no 'preprocess.layers.0.weight'"):
        Transolver.from_reference(sd, source="physicsnemo")
    te = {**_physicsnemo_state_dict(False), "blocks.0.ln_mlp1.fc1_weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="Transformer Engine layouts are not supported"):
        Transolver.from_reference(te, source="physicsnemo")
    with pytest.raises(ValueError, match="time-conditioned Transolvers are not supported"):
        Transolver.from_reference({**sd, "time_fc.0.weight": torch.zeros(1)}, source="thuml")
    with pytest.raises(ValueError, match=r"\['n_layers'\] are inferred from the state dict"):
        Transolver.from_reference(sd, source="thuml", n_layers=2)
    with pytest.raises(TypeError, match="Expected 'state_dict' to be a mapping"):
        Transolver.from_reference([1, 2], source="thuml")


def test_options_pass_through():
    model = Transolver.from_reference(_thuml_state_dict(True), source="thuml", dropout=0.1, checkpoint=True)
    assert model.checkpoint and model.config["dropout"] == 0.1
