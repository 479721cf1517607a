"""Mixup (``model.mixup``): the batch blending and the blended loss against naive references, and on the
real FSDD speaker recipe through the ``mmte`` CLI, one training step checked against a hand-mixed batch
pushed through the same model with soft-label cross-entropy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmte.training import mixup

ROOT = Path(__file__).resolve().parents[2]
FSDD = ROOT / ".." / "shared" / "data" / "fsdd" / "recordings"


def test_mix_inputs_blends_floats_and_keeps_the_longer_length():
    g = torch.Generator().manual_seed(0)
    fb = torch.randn(4, 6, 3, generator=g)
    frames = torch.tensor([6, 2, 4, 3])
    mask = torch.tensor([[True, False], [False, False], [False, True], [True, True]])
    batch = {"audio": {"fbank": fb, "frames": frames, "mask": mask}, "label": torch.tensor([0, 1, 2, 3])}
    perm = torch.tensor([2, 0, 3, 1])
    out = mixup.mix_inputs(batch, ["audio"], 0.7, perm)
    for i in range(4):
        torch.testing.assert_close(out["audio"]["fbank"][i], 0.7 * fb[i] + 0.3 * fb[perm[i]])
        assert int(out["audio"]["frames"][i]) == max(int(frames[i]), int(frames[perm[i]]))
        assert out["audio"]["mask"][i].tolist() == [bool(a or b) for a, b in zip(mask[i], mask[perm[i]])]
    assert out["label"] is batch["label"]  # targets are not touched; the loss blends them
    with pytest.raises(ValueError, match=r"^mixup: input text.input_ids is an integer tensor of shape \(4, 5\) \(token ids\?\)"):
        mixup.mix_inputs({"text": {"input_ids": torch.zeros(4, 5, dtype=torch.long)}}, ["text"], 0.7, perm)


def test_draw_folds_lam_and_permutes():
    torch.manual_seed(0)
    lams = []
    for _ in range(200):
        lam, perm = mixup.draw(0.4, 8)
        lams.append(lam)
        assert sorted(perm.tolist()) == list(range(8))
    assert min(lams) >= 0.5 and max(lams) <= 1.0 and 0.6 < sum(lams) / len(lams) < 0.95
    with pytest.raises(ValueError, match=r"^mixup alpha must be > 0; got 0"):
        mixup.draw(0, 8)


def test_mixed_cross_entropy_is_the_soft_label_cross_entropy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, generator=g)
    y = torch.tensor([0, 3, 1, 1, 2])
    perm = torch.tensor([4, 2, 0, 1, 3])

    def loss(out, batch):
        l = F.cross_entropy(out["h"], batch["label"])
        return {"h": l, "loss": 2 * l}

    got = mixup.mixed_loss(loss, {"h": logits}, {"label": y}, ["label"], 0.8, perm)
    soft = 0.8 * F.one_hot(y, 4).float() + 0.2 * F.one_hot(y[perm], 4).float()
    ref = -(soft * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(got["h"], ref)
    torch.testing.assert_close(got["loss"], 2 * ref)


def test_bad_mixup_value_is_named():
    from mmte.training.module import MMTEModule

    with pytest.raises(ValueError, match=r"^mixup must be a number >= 0 \(the Beta\(alpha, alpha\) parameter; 0: off\); got -1"):
        MMTEModule(tokenizers={"audio": "audio"}, backbone="tiny", heads={"y": {"name": "classification", "num_classes": 3}}, mixup=-1)


def test_mixup_step_on_the_speaker_recipe_matches_a_hand_mixed_batch(tmp_path):
    """The real recipe (FSDD speakers, conv stem, frozen trunk with LoRA; the tiny trunk keeps it quick):
    ``training_step`` under mixup equals the soft-label cross-entropy of the model on a batch mixed by hand
    with the same draw; then ``mmte fit --model.mixup 0.4`` trains three steps and writes its checkpoint."""
    from mmte.cli import MMTECLI
    from tests.conftest import need_data

    data = str(need_data(FSDD, "FSDD recordings"))
    args = ["--config", str(ROOT / "recipes" / "fsdd_speakers.yaml"), "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml"),
            "--data.init_args.data_dir", data, "--model.mixup", "0.4", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path / "run")]
    cli = MMTECLI(args=args, run=False)
    module, dm = cli.model, cli.datamodule
    assert module.hparams.mixup == 0.4
    dm.setup("fit")
    module.configure_model()
    module.train()
    torch.manual_seed(3)
    batch = next(iter(dm.train_dataloader()))
    module.log = lambda *a, **k: None  # outside a Trainer
    state = torch.random.get_rng_state()
    got = module.training_step(batch, 0)
    torch.random.set_rng_state(state)
    lam, perm = mixup.draw(0.4, batch["label"].shape[0])
    fb, fr = batch["audio"]["fbank"], batch["audio"]["frames"]
    mixed = {**batch, "audio": {"fbank": lam * fb + (1 - lam) * fb[perm], "frames": torch.maximum(fr, fr[perm])}}
    logits = module.model(mixed)["digit"]
    soft = lam * F.one_hot(batch["label"], 10).float() + (1 - lam) * F.one_hot(batch["label"][perm], 10).float()
    ref = -(soft * logits.float().log_softmax(-1)).sum(-1).mean()
    assert 0.5 <= lam <= 1 and not torch.equal(perm, torch.arange(len(perm)))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)

    fit = MMTECLI(args=["fit", *args, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"])
    assert fit.trainer.global_step == 3 and torch.isfinite(fit.trainer.callback_metrics["train_loss"])
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
