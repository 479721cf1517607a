"""``mmte convert``: pretrained weights (Hugging Face, timm, Meta-Transformer, a named source) -> an mmte
backbone ``.safetensors`` file, or a distributed checkpoint folder -> one portable ``.ckpt``."""

from __future__ import annotations

import argparse
import os

from ..errors import UnknownNameError, UsageError
from ._util import warn

__all__ = ["convert_main"]


def convert_main(argv: list[str]) -> int:
    """``mmte convert``: pretrained weights -> an mmte backbone ``.safetensors`` usable as ``backbone_weights``."""
    p = argparse.ArgumentParser(
        prog="mmte convert",
        description=(
            "Convert pretrained transformer weights into an mmte backbone file (safetensors, mmte key names, the "
            "BackboneConfig in the metadata). Use it in a recipe as model.backbone_weights: <file>."
        ),
    )
    p.add_argument("--from", dest="kind", choices=["hf", "timm", "meta-transformer", "named", "dcp"],
                   help="hf: a local Hugging Face BERT/ViT/CLIP-vision folder; timm: a timm model name (with --checkpoint); "
                        "meta-transformer: the release's .pth; named: a named source such as minilm-l6; dcp: a distributed "
                        "checkpoint folder (save_distributed_checkpoint: true) -> one portable .ckpt (inferred for such a folder)")
    p.add_argument("source", help="folder, model name, file or named source")
    p.add_argument("out_path", nargs="?", help="output file (same as --out)")
    p.add_argument("--out", help="output path: .safetensors (backbone weights) or .ckpt (--from dcp)")
    p.add_argument("--checkpoint", help="timm: local weights file for the model (nothing is downloaded)")
    p.add_argument("--preset", default="meta-transformer-b16", help="meta-transformer: the backbone shape (default %(default)s)")
    a = p.parse_args(argv)
    a.out = a.out or a.out_path
    if a.kind is None and os.path.isfile(os.path.join(a.source, ".metadata")):
        a.kind = "dcp"
    if a.kind is None or a.out is None:
        raise UsageError(f"mmte convert {' '.join(argv)} lacks {'--from' if a.kind is None else 'an output path'}",
                         "expected --from {hf,timm,meta-transformer,named,dcp} and an output path (--out FILE)", "see mmte convert --help")
    if a.kind == "dcp":
        if not a.out.endswith(".ckpt"):
            raise UsageError(f"--out must end in .ckpt for a distributed checkpoint; got {a.out!r}", "expected a .ckpt path",
                             f"use --out {os.path.splitext(a.out)[0]}.ckpt")
        from ..training.portable import consolidate

        ckpt = consolidate(a.source, a.out)
        print(f"wrote {a.out}: {len(ckpt['state_dict'])} tensors from the distributed checkpoint {a.source} (usable by one process or any layout)")
        return 0
    if not a.out.endswith(".safetensors"):
        raise UsageError(f"--out must end in .safetensors; got {a.out!r}", "expected a .safetensors path", f"use --out {os.path.splitext(a.out)[0]}.safetensors")
    import dataclasses
    import json

    from safetensors.torch import save_file

    from ..encoders import from_hf, from_timm, load_meta_transformer

    if a.kind == "hf":
        from ..training.module import resolve_backbone_source

        backbone = resolve_backbone_source("hf:" + a.source)
    elif a.kind == "named":
        from ..training.module import BACKBONE_SOURCES, resolve_backbone_source

        if a.source.lower() not in BACKBONE_SOURCES:
            raise UnknownNameError("named source", a.source, BACKBONE_SOURCES, "see mmte convert --help")
        backbone = resolve_backbone_source(a.source)
    elif a.kind == "timm":
        import timm

        if a.checkpoint and not os.path.isfile(a.checkpoint):
            raise UsageError(f"--checkpoint {a.checkpoint} does not exist", "expected a local weights file for the timm model", "check the path")
        if not a.checkpoint:
            warn(f"--from timm without --checkpoint writes timm's RANDOM initialisation of {a.source} (mmte downloads nothing); "
                  "pass --checkpoint <weights file> for pretrained weights")
        if a.source not in timm.list_models():
            raise UnknownNameError("timm model", a.source, timm.list_models(), "see timm.list_models()")
        model = timm.create_model(a.source, pretrained=False, checkpoint_path=a.checkpoint or "")
        backbone = from_timm(model).backbone
    else:
        backbone = load_meta_transformer(a.source, a.preset)
    del from_hf
    sd = {k: v.contiguous() for k, v in backbone.state_dict().items()}
    meta = {"format": "mmte-backbone", "config": json.dumps(dataclasses.asdict(backbone.config)), "source": f"{a.kind}:{a.source}"}
    from ..training.callbacks import atomic_write_with

    atomic_write_with(a.out, lambda tmp: save_file(sd, tmp, metadata=meta))
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {a.out}: {len(sd)} tensors, {n:,} parameters, {backbone.config.num_layers}x{backbone.config.hidden_size} ({a.kind}:{a.source})")
    return 0

