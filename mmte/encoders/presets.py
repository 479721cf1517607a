"""Named backbone sizes.

``meta-transformer-b16`` / ``-l14`` are the shapes of the released Meta-Transformer encoders (a ViT
trunk: pre-norm, exact GELU, qkv bias, LayerNorm eps 1e-5, no final norm — the release is blocks only).
``minilm-l6`` is all-MiniLM-L6-v2's BERT trunk (post-norm, eps 1e-12), the pretrained encoder of the
quickstart. ``tiny`` and ``small`` are for tests and quick experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["PRESETS", "BackboneConfig", "get_preset", "list_presets"]


@dataclass(frozen=True)
class BackboneConfig:
    """Everything that fixes a backbone's shape and numerics.

    Attributes:
        num_layers: transformer layers ``L``.
        hidden_size: width ``D``.
        num_attention_heads: heads ``H`` (``D % H == 0``).
        ffn_hidden_size: MLP width (default ``4 * D``).
        activation: MLP activation (see :data:`mmte.te.ACTIVATIONS`).
        normalization: ``"LayerNorm"`` or ``"RMSNorm"``.
        layernorm_epsilon: epsilon of every norm.
        layer_norm_position: ``"pre"`` (ViT/CLIP) or ``"post"`` (BERT).
        qkv_bias: bias on the QKV GEMM.
        bias: biases on projection and MLP GEMMs.
        pre_norm: a norm before the first layer (CLIP's ``ln_pre``).
        final_norm: a norm after the last layer (ViT's ``norm``).
        drop_path_rate: stochastic depth, rising linearly from 0 to this over the layers (as timm).
        layer_scale_init: per-channel layer scale initial value (None: off).
        hidden_dropout, attention_dropout: dropout probabilities.
        attention_backend: force an SDPA backend ("math", "flash", "efficient", "cudnn") or None.
    """

    num_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    ffn_hidden_size: int | None = None
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    layernorm_epsilon: float = 1e-5
    layer_norm_position: str = "pre"
    qkv_bias: bool = True
    bias: bool = True
    pre_norm: bool = False
    final_norm: bool = True
    drop_path_rate: float = 0.0
    layer_scale_init: float | None = None
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    attention_backend: str | None = None

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_attention_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"BackboneConfig.{name} must be a positive int; got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes) -> BackboneConfig:
        names = {f.name for f in fields(self)}
        bad = sorted(set(changes) - names)
        if bad:
            raise ValueError(f"unknown BackboneConfig field(s) {bad}; expected some of {sorted(names)}")
        return replace(self, **changes)


PRESETS: dict[str, BackboneConfig] = {
    "meta-transformer-b16": BackboneConfig(12, 768, 12, 3072, final_norm=False),
    "meta-transformer-l14": BackboneConfig(24, 1024, 16, 4096, final_norm=False),
    "vit-b16": BackboneConfig(12, 768, 12, 3072, layernorm_epsilon=1e-6),
    "minilm-l6": BackboneConfig(
        6, 384, 12, 1536, layernorm_epsilon=1e-12, layer_norm_position="post", final_norm=False
    ),
    "small": BackboneConfig(4, 192, 3, 768),
    "tiny": BackboneConfig(2, 64, 4, 128),
}


def list_presets() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str, **overrides) -> BackboneConfig:
    """A preset's config, optionally with fields overridden (``get_preset("tiny", num_layers=4)``)."""
    if name not in PRESETS:
        from ..errors import UnknownNameError

        raise UnknownNameError("backbone preset", name, list_presets(), "set model.backbone to one of them")
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
