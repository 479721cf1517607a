"""The module interface of MMTEStrategy: MMTEModule implements ParallelModule itself; any other
LightningModule with a ``model`` goes through PlainModule's defaults."""

from __future__ import annotations

import typing

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from mmte.training.module import MMTEModule
from mmte.training.protocols import ParallelModule, PlainModule, as_parallel_module

TOKS = {"image": {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}}
HEADS = {"digit": {"name": "classification", "pool": "mean"}}


def test_mmte_module_implements_the_interface_itself():
    m = MMTEModule(TOKS, "tiny", HEADS, data_info={"num_classes": 10})
    assert isinstance(m, ParallelModule) and as_parallel_module(m) is m
    members = set(typing.get_type_hints(ParallelModule)) | {n for n in vars(ParallelModule) if not n.startswith("_")}
    assert all(hasattr(m, n) for n in members)
    assert m.shares_pipeline_boundary
    full = m.meta_model()
    assert full.backbone.config.num_layers == 2 and all(p.is_meta for p in full.parameters())


class _Plain(L.LightningModule):
    def __init__(self, loss_fn=None):
        super().__init__()
        self.model = torch.nn.Linear(3, 4)
        if loss_fn is not None:
            self.loss_fn = loss_fn


def test_a_plain_module_gets_the_defaults():
    m = _Plain()
    api = as_parallel_module(m)
    assert isinstance(api, PlainModule) and not isinstance(m, ParallelModule)
    assert api.model is m.model and api.meta_model() is None and api.fp8_convert is None and not api.shares_pipeline_boundary
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    args, kwargs, target = api.pipeline_inputs((x, y))
    assert args[0] is x and kwargs == {} and target is y
    out = m.model(x)
    assert torch.equal(api.pipeline_loss(out, y), F.cross_entropy(out, y))
    # evaluation: the loss of the merged outputs; training: the mean of the microbatch losses; None off the last stage
    assert torch.equal(api.pipeline_outputs(out, (x, y), "val", []), F.cross_entropy(out, y).float())
    assert api.pipeline_outputs(None, (x, y), "train", []) is None
    assert api.pipeline_outputs(None, (x, y), "train", [torch.tensor(1.0), torch.tensor(3.0)]) == 2.0
    api.automatic_optimization = False
    assert m.automatic_optimization is False
    new = torch.nn.Linear(3, 4)
    api.model = new
    assert m.model is new
    with pytest.raises(TypeError, match=r"define _Plain.pipeline_inputs\(batch\) or return \(x, y\) batches; got dict"):
        api.pipeline_inputs({"x": x})
    with pytest.raises(TypeError, match="needs _Plain.optimizer_param_names"):
        api.optimizer_param_names()


def test_a_plain_module_uses_its_own_loss_fn():
    api = as_parallel_module(_Plain(loss_fn=F.mse_loss))
    out, y = torch.randn(2, 4), torch.randn(2, 4)
    assert torch.equal(api.pipeline_loss(out, y), F.mse_loss(out, y))
