"""The TransformerEngine backend: key mapping (runs everywhere) and the real layer (needs TE + CUDA)."""

import pytest
import torch

from mmte import te
from mmte.encoders import Backbone
from mmte.te.backend import from_te_state_dict, te_activation, te_available, to_te_state_dict


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_state_dict_mapping_round_trips(activation):
    layer = te.TransformerLayer(32, 64, 4, activation=activation)
    sd = {"layers.3." + k: v for k, v in layer.state_dict().items()}
    mapped = to_te_state_dict(sd, "layers.3.")
    assert "layers.3.self_attention.layernorm_qkv.layer_norm_weight" in mapped
    assert "layers.3.self_attention.layernorm_qkv.weight" in mapped
    assert mapped["layers.3.layernorm_mlp.fc1_weight"].shape == ((128 if activation == "swiglu" else 64), 32)
    back = from_te_state_dict(mapped, activation == "swiglu", "layers.3.")
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert torch.equal(back[k], v)


def test_te_activation_names():
    assert te_activation("quick_gelu") == "qgelu" and te_activation("swiglu") == "swiglu"
    with pytest.raises(ValueError, match="no TransformerEngine equivalent"):
        te_activation("mish")


def test_unavailable_backend_says_why():
    ok, why = te_available()
    if ok:
        pytest.skip("transformer_engine is installed here")
    assert "transformer_engine" in why
    with pytest.raises(RuntimeError, match="backend='te' is unavailable"):
        Backbone("tiny", backend="te")


@pytest.mark.gpu
def test_te_layer_matches_native_on_cuda():
    ok, why = te_available()
    if not ok or not torch.cuda.is_available():
        pytest.skip(f"needs TransformerEngine on CUDA: {why or 'no CUDA device'}")
    native = Backbone("tiny", activation="gelu_tanh").cuda().eval()
    theirs = Backbone("tiny", activation="gelu_tanh", backend="te", device="cuda").eval()
    theirs.load_state_dict(native.state_dict())
    x = torch.randn(2, 16, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), native(x), rtol=1e-4, atol=1e-4)
