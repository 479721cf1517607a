"""Bad inputs through the real ``mmte`` command: one row per case, each asserting the exit status and the exact
one-line ``mmte: error: ...`` message, and that no traceback is printed (``MMTE_DEBUG=1`` brings it back).

Most rows fail before anything trains: they run ``mmte.cli.main`` in-process on a shared folder of small bad
files. A few run ``python -m mmte`` in a subprocess (the console script's exit status, a read-only folder).
docs/reliability.md ("What is tested") counts these rows. Each class of error keeps a row or two here (the exit
status and the line through the command); the other bad values of a class are tested where they are refused
(the DataModule, the tokenizer, the weights and checkpoint loaders: ``tests/training``, ``tests/tokenizers``,
``tests/encoders/test_convert.py``, ``tests/cli/test_checkpoint.py``), in milliseconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# datasets, lightning, torchmetrics: imported while pytest collects, so the log handlers they add bind to the
# session's stderr, not to the capsys stream of the test that imports them first (closed after it)
import datasets  # noqa: F401
import lightning.pytorch  # noqa: F401
import numpy as np
import pytest
import torchmetrics  # noqa: F401

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[1]
R = str(ROOT)
QUICK = ["--config", f"{R}/recipes/quickstart.yaml", "--config", f"{R}/configs/encoders/tiny.yaml"]
WINE = ["--config", f"{R}/recipes/tabular_wine.yaml"]
ETT = ["--config", f"{R}/recipes/etth1_forecast.yaml"]
FSDD = ["--config", f"{R}/recipes/fsdd_audio.yaml", "--config", f"{R}/configs/encoders/tiny.yaml"]
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.max_epochs", "1",
        "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]


# ------------------------------------------------------------------------------------ fixture files
@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    """A folder of small bad inputs shared by the rows (and one trained tabular checkpoint)."""
    d = tmp_path_factory.mktemp("bad")
    (d / "header_only.csv").write_text("a,b,target\n")
    # two numeric columns (40 rows: one bad value is a stray, not a sign of a categorical column)
    rows = "".join(f"{i * 0.37:.2f},{(i * 3) % 5 + 0.25 * i:.2f},{'xy'[i % 2]}\n" for i in range(40))
    (d / "nan_label.csv").write_text("a,b,target\n" + rows + "3,4,\n")
    (d / "ett_nan.csv").write_text("date,a,b\n" + "".join(f"2020-01-01 {i % 24:02d}:00,{i},{'nan' if i == 130 else i * 2}\n" for i in range(200)))
    (d / "empty.yaml").write_text("")
    (d / "comments.yaml").write_text("# only a comment\n\n")
    (d / "list.yaml").write_text("- trainer\n- model\n")
    (d / "broken.yaml").write_text("trainer:\n  max_epochs: 1\n model: x\n")
    (d / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    # WAVs: two real spoken digits per class 0/1 (synthetic tones if FSDD is absent) and one with a NaN sample
    import soundfile as sf

    wavs = d / "wavs"
    wavs.mkdir()
    t = np.arange(4000) / 8000
    for i in range(8):
        sf.write(str(wavs / f"{i % 2}_x_{i}.wav"), (0.3 * np.sin(2 * np.pi * (300 + 100 * i) * t)).astype(np.float32), 8000, subtype="FLOAT")
    bad = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    bad[1234] = np.nan
    sf.write(str(wavs / "1_x_9.wav"), bad, 8000, subtype="FLOAT")
    # a wine table with a fourth class, for a checkpoint trained on three
    from sklearn.datasets import load_wine

    f = load_wine(as_frame=True).frame
    f.loc[f.index[:10], "target"] = 3
    f.to_csv(d / "wine4.csv", index=False)
    # one trained checkpoint (tabular wine, 2 steps) and a truncated copy
    rc = main(["fit", *WINE, *FAST, "--trainer.default_root_dir", str(d / "wine_run")])
    assert rc == 0
    best = d / "wine_run" / "checkpoints" / "best.ckpt"
    (d / "truncated.ckpt").write_bytes(best.read_bytes()[:5000])
    return d


# ------------------------------------------------------------------------------------------- rows
def _row(argv: list[str], code: int, message: str) -> tuple[list[str], int, str]:
    return argv, code, message


# id -> (argv, exit status, expected message: exact text, or a regex when it starts with "re:")
# {fx}: the fixture folder, {root}: the row's fresh --trainer.default_root_dir, {R}: the repository
ROWS: dict[str, tuple[list[str], int, str]] = {
    "batch_size_0": _row(["fit", *QUICK, "--data.init_args.batch_size", "0"], 2,
                     "batch_size must be a positive int; got 0"),
    "devices_0": _row(["fit", *QUICK, "--trainer.devices", "0"], 2,
                  "--trainer.devices is '0', expected a positive number of devices, a list of device ids, -1 (all) or 'auto', set --trainer.devices 1"),
    "devices_-2": _row(["fit", *QUICK, "--trainer.devices", "-2"], 2,
                   "--trainer.devices is '-2', expected a positive number of devices, a list of device ids, -1 (all) or 'auto', set --trainer.devices 1"),
    "accelerator_gpu_without_gpu": _row(["fit", *QUICK, "--trainer.accelerator", "gpu"], 2,
                                    "--trainer.accelerator is 'gpu' but this machine has no such device (found: CPU only), expected an accelerator "
                                    "that is present, set --trainer.accelerator auto (or cpu)"),
    "empty_yaml": _row(["fit", "--config", "{fx}/empty.yaml"], 2,
                   "--config {fx}/empty.yaml is empty, expected a YAML mapping such as recipes/quickstart.yaml (trainer:, model:, data:), "
                   "fill it in or drop this --config"),
    "comment_only_yaml": _row(["fit", *QUICK, "--config", "{fx}/comments.yaml"], 2,
                          "--config {fx}/comments.yaml is empty, expected a YAML mapping such as recipes/quickstart.yaml (trainer:, model:, data:), "
                          "fill it in or drop this --config"),
    "yaml_list": _row(["fit", "--config", "{fx}/list.yaml"], 2,
                  "--config {fx}/list.yaml holds a list, not a mapping, expected keys such as trainer:, model:, data:, see recipes/quickstart.yaml "
                  "for the layout"),
    "yaml_syntax": _row(["fit", "--config", "{fx}/broken.yaml"], 2,
                    "re:--config {fx}/broken.yaml is not valid YAML \\(.* line 3, column 2\\), expected a YAML mapping, fix the file "
                    "\\(indentation, colons, quotes\\)"),
    "recipe_typo": _row(["fit", "--config", "{R}/recipes/quickstrt.yaml"], 2,
                    "re:--config {R}/recipes/quickstrt.yaml does not exist, expected a recipe or fragment YAML file \\(in {R}/recipes: "
                    ".*quickstart.yaml.*\\), did you mean {R}/recipes/quickstart.yaml\\?"),
    "unknown_command": _row(["fitt", *QUICK], 2,
                        "unknown command 'fitt', expected one of {commands} (did you mean 'fit'?), see mmte --help"),
    "unknown_option": _row(["fit", *QUICK, "--model.lrr", "0.1"], 2,
                       "unknown option --model.lrr, expected an option listed by mmte fit --help (did you mean --model.lr?), fix the spelling "
                       "or drop it"),
    "unknown_modality": _row(["fit", *QUICK, "--model.tokenizers", "{image: {name: imag}}"], 2,
                         "unknown modality 'imag', expected one of audio, graph, hyperspectral, image, imu, infrared, point_cloud, tabular, "
                         "text, time_series, video, xray (did you mean 'image'?), see mmte list modalities (to add one: docs/extending.md)"),
    "unknown_head": _row(["fit", *QUICK, "--model.heads", "{digit: {name: clasification}}"], 2,
                     "unknown head 'clasification', expected one of classification, contrastive, forecasting, regression, token (did you mean "
                     "'classification'?), set the head's name: to one of them (new heads: see docs/extending.md)"),
    "unknown_strategy": _row(["fit", *QUICK, "--trainer.strategy", "dpp"], 2,
                         "re:unknown strategy 'dpp', expected one of auto, ddp, .* \\(did you mean 'ddp'\\?\\), or stack a configs/parallel/\\*.yaml "
                         "fragment \\(e.g. ddp.yaml, tp2.yaml\\)"),
    "unknown_tokenizer_option": _row(["fit", *QUICK, "--model.tokenizers", "{image: {name: image, img_size: 8, patch_sise: 4, in_chans: 1}}"], 2,
                                 "re:--model.tokenizers.image.patch_sise: no registered tokenizer has the option 'patch_sise', expected one of "
                                 "name, .*patch_size, .*img_size, .* \\(did you mean 'patch_size'\\?\\), fix the spelling or drop it "
                                 "\\(mmte list modalities shows the tokenizers\\)"),
    "patch_size_string": _row(["fit", *QUICK, "--model.tokenizers", "{image: {name: image, img_size: 8, patch_size: '4', in_chans: 1}}"], 2,
                          "image tokenizer option patch_size is '4' (a str), expected an int or a list [an int, an int], write patch_size: 4 "
                          "(no quotes: a quoted number is a string)"),
    "tokenizer_dim_twice": _row(["fit", *QUICK, "--model.tokenizers", "{image: {name: image, img_size: 8, patch_size: 4, in_chans: 1, dim: 32}}"], 2,
                            "image tokenizer option dim is 32, but a tokenizer's width is the backbone's hidden size (64), expected no dim among "
                            "the tokenizer's options, remove dim (the backbone preset sets the width)"),
    "tp_0": _row(["fit", *QUICK, "--trainer.strategy", "mmte.training.strategy.MMTEStrategy", "--trainer.strategy.tp", "0"], 2,
             "ParallelDims.tp must be an int >= 1; got 0"),
    "header_only_csv": _row(["fit", *WINE, "--data.init_args.path", "{fx}/header_only.csv"], 2,
                           "path '{fx}/header_only.csv' has a header but no rows; expected at least one data row"),
    "csv_empty_label": _row(["fit", *WINE, "--data.init_args.path", "{fx}/nan_label.csv"], 2,
                           "train nan_label.csv row 40 (line 42), column 'target': the label is empty or NaN (1 such row(s)); fill it, or set missing_label: drop to skip such rows"),
    "ett_nan": _row(["fit", *ETT, "--data.init_args.path", "{fx}/ett_nan.csv"], 2,
                   "path '{fx}/ett_nan.csv' row 130 (line 132), column 'b': 'nan' is not a finite number; fill or drop such rows (1 cell(s) in all)"),
    "wav_nan_sample": _row(["fit", *FSDD, "--data.init_args.data_dir", "{fx}/wavs", "--data.init_args.val_regex", "_[01]\\.wav$"], 2,
                       "audio file {fx}/wavs/1_x_9.wav has a non-finite sample (nan) at index 1234 of 4000 (1 in all), expected finite "
                       "samples, replace or drop the file, or set on_corrupt: skip to drop such files"),
    "data_dir_missing": _row(["fit", *FSDD, "--data.init_args.data_dir", "{fx}/nowhere"], 2,
                         "data_dir '{fx}/nowhere' is not a folder, a file or a glob that matches files; give an existing folder, file or glob"),
    "malformed_safetensors": _row(["fit", *QUICK, "--model.backbone_weights", "{fx}/bad.safetensors"], 2,
                              "weights file {fx}/bad.safetensors is malformed or truncated (SafetensorError: Error while deserializing header: "
                              "invalid header length), expected a complete safetensors file of tensors, replace it (e.g. write it again with "
                              "mmte convert)"),
    "truncated_checkpoint": _row(["validate", *WINE, "--ckpt_path", "{fx}/truncated.ckpt"], 2,
                             "--ckpt_path {fx}/truncated.ckpt is not a complete checkpoint (truncated, or not written by torch.save; 5000 bytes), "
                             "expected a .ckpt file written by mmte fit, use another checkpoint (e.g. {root}/checkpoints/best.ckpt) or train again"),
    "missing_checkpoint": _row(["validate", *WINE, "--ckpt_path", "{fx}/nope.ckpt"], 2,
                           "--ckpt_path {fx}/nope.ckpt does not exist, expected a checkpoint file written by mmte fit (or best / last), run mmte "
                           "fit first"),
    "best_before_any_fit": _row(["validate", *WINE, "--ckpt_path", "best"], 2,
                            "--ckpt_path best: there is no {root}/checkpoints/best.ckpt, expected the best checkpoint of an earlier mmte fit "
                            "with this default_root_dir, run mmte fit first, or pass --ckpt_path <file>"),
    "checkpoint_other_class_count": _row(["validate", *WINE, "--data.init_args.path", "{fx}/wine4.csv", "--ckpt_path",
                                      "{fx}/wine_run/checkpoints/best.ckpt"], 2,
                                        "val wine4.csv row 0 (line 2), column 'target': label '3' is not a class of the training split (['0', '1', '2']); remove the row, or train with that class"),
    "model_flag_disagrees_with_checkpoint": _row(["validate", *WINE, "--ckpt_path", "{fx}/wine_run/checkpoints/best.ckpt", "--model.freeze",
                                              "backbone"], 2,
                                             "--model.freeze is 'backbone' but the checkpoint {fx}/wine_run/checkpoints/best.ckpt was trained "
                                             "with 'none', expected --model flags that agree with --ckpt_path (the checkpoint defines the "
                                             "model; only backbone_weights, fuse_for_inference, predict_dtype, save_frozen may differ), drop "
                                             "--model.freeze, or train a model with it (mmte fit)"),
    "convert_unknown_timm_model": _row(["convert", "--from", "timm", "vit_tiny_patch16_2244", "--checkpoint", "{fx}/bad.safetensors", "--out",
                                    "{root}/x.safetensors"], 2,
                                   "re:unknown timm model 'vit_tiny_patch16_2244', expected one of .* \\(did you mean "
                                   "'vit_tiny_patch16_224'\\?\\), see timm.list_models\\(\\)"),
    "convert_out_suffix": _row(["convert", "--from", "named", "minilm-l6", "--out", "{root}/x.pt"], 2,
                           "--out must end in .safetensors; got '{root}/x.pt', expected a .safetensors path, use --out {root}/x.safetensors"),
}


def _fill(s: str, fx: Path, root: Path) -> str:
    from mmte.cli import COMMANDS, LIGHTNING_COMMANDS

    commands = ", ".join(sorted([*LIGHTNING_COMMANDS, *COMMANDS]))
    return s.replace("{fx}", str(fx)).replace("{root}", str(root)).replace("{R}", R).replace("{commands}", commands)


@pytest.mark.parametrize("case", list(ROWS), ids=list(ROWS))
def test_bad_input_gives_one_line(case, fx, tmp_path, capsys):
    argv, code, want = ROWS[case]
    root = tmp_path / "run"
    args = [_fill(a, fx, root) for a in argv]
    if args[0] in ("fit", "validate", "test", "predict"):
        args += [*FAST, "--trainer.default_root_dir", str(root)]
    rc = main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("mmte: error:")]
    assert rc == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    got = lines[0][len("mmte: error: ") :]
    want = _fill(want, fx, root)
    if want.startswith("re:"):
        pat = want[3:].replace(str(fx), re.escape(str(fx))).replace(R, re.escape(R))
        assert re.fullmatch(pat, got), got
    else:
        assert got == want
    if args[0] == "fit":
        assert not root.exists() or not any((root / "checkpoints").glob("*.ckpt")), "a failed run left a checkpoint"


# ----------------------------------------------------------------------------- through a subprocess
def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([R, os.environ.get("PYTHONPATH", "")]), **extra}


def _without_root_override() -> None:
    """preexec_fn for root: drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH from the bounding set, so the exec'd
    command obeys file permissions like any user (prctl PR_CAPBSET_DROP)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_console_exit_status_and_debug_traceback(tmp_path):
    """``python -m mmte`` exits with main's status (it used to print the line and exit 0); MMTE_DEBUG=1 shows the
    traceback instead of the line."""
    cmd = [sys.executable, "-m", "mmte", "fit", *QUICK, "--data.init_args.batch_size", "0", "--trainer.default_root_dir", str(tmp_path / "r")]
    plain, debug = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # at the same time
                    for env in (_env(), _env(MMTE_DEBUG="1")))
    p_err, d_err = plain.communicate(timeout=300)[1], debug.communicate(timeout=300)[1]
    assert plain.returncode == 2, p_err[-2000:]
    assert p_err.strip().splitlines()[-1] == "mmte: error: batch_size must be a positive int; got 0" and "Traceback" not in p_err
    assert debug.returncode == 1 and "Traceback (most recent call last)" in d_err, d_err[-2000:]
    assert "ValueError: batch_size must be a positive int; got 0" in d_err and "mmte: error:" not in d_err
    assert not (tmp_path / "r").exists()


def test_read_only_output_folder(tmp_path):
    """A folder the user cannot write to: one line before anything starts (as root, the command runs without
    root's permission override, since root writes anywhere)."""
    import tempfile

    ro = Path(tempfile.mkdtemp(prefix="mmte-ro-"))
    try:
        ro.chmod(0o555)
        kw = {"preexec_fn": _without_root_override} if os.geteuid() == 0 else {}
        cmd = [sys.executable, "-m", "mmte", "fit", *QUICK, "--trainer.default_root_dir", str(ro / "run")]
        try:
            p = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=300, **kw)
        except subprocess.SubprocessError as e:  # no CAP_SETPCAP: root cannot give up its override here
            pytest.skip(f"cannot run without root's permission override: {e}")
        assert p.returncode == 2, p.stderr[-2000:]
        assert p.stderr.strip().splitlines()[-1] == (
            f"mmte: error: --trainer.default_root_dir {ro}/run cannot be written ({ro}: Permission denied), expected a writable folder for "
            "logs and checkpoints, choose another --trainer.default_root_dir (or fix the folder's permissions)"
        )
        assert "Traceback" not in p.stderr and list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
        ro.rmdir()


# ------------------------------------------------------------------------ fixes and loud warnings
def test_logger_false_trains(tmp_path, capsys):
    """``--trainer.logger false`` used to fail on the learning-rate monitor; now it trains and checkpoints."""
    root = tmp_path / "r"
    assert main(["fit", *QUICK, *FAST, "--trainer.logger", "false", "--trainer.default_root_dir", str(root)]) == 0
    assert (root / "checkpoints" / "last.ckpt").is_file() and not (root / "logs").exists()


def test_predict_without_checkpoint_warns(tmp_path, capsys):
    root = tmp_path / "r"
    assert main(["predict", *QUICK, *FAST, "--trainer.default_root_dir", str(root), "--prediction_writer.print_rows", "0"]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mmte: warning:")]
    assert warn == [
        (
            "mmte: warning: predict without --ckpt_path: the heads (digit) and tokenizers are randomly initialised (the backbone too has no "
            "pretrained weights; the output is meaningless). Pass --ckpt_path best (or a .ckpt written by mmte fit)"
        )
    ]


def test_convert_timm_without_checkpoint_warns(tmp_path, capsys):
    pytest.importorskip("timm")
    out = tmp_path / "v.safetensors"
    assert main(["convert", "--from", "timm", "vit_tiny_patch16_224", "--out", str(out)]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mmte: warning:")]
    assert warn == [
        (
            "mmte: warning: --from timm without --checkpoint writes timm's RANDOM initialisation of vit_tiny_patch16_224 (mmte downloads "
            "nothing); pass --checkpoint <weights file> for pretrained weights"
        )
    ]
    assert out.is_file() and not list(tmp_path.glob(".tmp-*"))


def test_checkpoint_overridable_flag_is_applied(fx, tmp_path, capsys):
    """A flag users may change with --ckpt_path (predict_dtype) is kept, not silently replaced by the checkpoint's."""
    from mmte.cli import MMTECLI

    cli = MMTECLI(args=["validate", *WINE, *FAST, "--trainer.default_root_dir", str(tmp_path / "r"), "--ckpt_path",
                        str(fx / "wine_run" / "checkpoints" / "best.ckpt"), "--model.predict_dtype", "bf16"])
    assert cli.model.hparams.predict_dtype == "bf16" and cli.model.hparams.lr == 2.0e-3


# ------------------------------------------------------------------------------------ registries
PLUGIN = '''
import torch
from mmte.tokenizers.base import TokenSeq

class Tok(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = torch.nn.Linear(3, dim)

    def forward(self, x):
        return TokenSeq(self.proj(x), None)
'''


def test_registering_a_builtin_name_first_hides_nothing(tmp_path):
    """Registering ``audio`` before the registry's first read used to hide the six built-ins imported after audio
    (the import of the built-in audio module failed half-way); now the built-ins come first and the clash names both."""
    (tmp_path / "myaudio.py").write_text(PLUGIN)
    code = (
        "from mmte.errors import UsageError\n"
        "from mmte.tokenizers.registry import register_modality, list_modalities\n"
        "from myaudio import Tok\n"
        "try:\n    register_modality('audio', tokenizer=Tok)\nexcept UsageError as e:\n    print('ERR', e)\n"
        "print(list_modalities())\n"
    )
    p = subprocess.run([sys.executable, "-c", code], check=False, env=_env(PYTHONPATH=os.pathsep.join([str(tmp_path), R])), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.strip().splitlines()
    assert out[0] == (
        "ERR modality 'audio' is already registered by mmte.tokenizers.audio.AudioTokenizer; myaudio.Tok registers it again, expected a "
        "modality name not taken yet, register it under another name (or pass override=True to replace the first)"
    )
    assert out[1] == str(["audio", "graph", "hyperspectral", "image", "imu", "infrared", "point_cloud", "tabular", "text", "time_series", "video",
                          "xray"])


def test_plugin_entry_point_clash_names_both_sources(tmp_path):
    site = tmp_path / "site"
    (site / "clash_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "clash_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: clash-plugin\nVersion: 0.1\n")
    (site / "clash_plugin-0.1.dist-info" / "entry_points.txt").write_text("[mmte.modalities]\naudio = clash_plugin:Tok\n")
    (site / "clash_plugin.py").write_text(PLUGIN)
    p = subprocess.run([sys.executable, "-m", "mmte", "modalities"], check=False, env=_env(PYTHONPATH=os.pathsep.join([str(site), R])), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "mmte: error: modality plug-in 'audio' (entry point audio = clash_plugin:Tok of distribution clash-plugin 0.1) clashes with the "
        "modality 'audio' registered by mmte.tokenizers.audio.AudioTokenizer, expected plug-ins to use new modality names, rename the entry "
        "point in the plug-in's metadata, or uninstall it (clash-plugin)"
    )


def test_head_name_clash_names_both_sources():
    from mmte.errors import UsageError
    from mmte.heads import Head, get_head, register_head

    class MyHead(Head):
        pass

    with pytest.raises(UsageError) as e:
        register_head("classification")(MyHead)
    assert str(e.value) == (
        "head 'classification' is already registered by mmte.heads.heads.ClassificationHead; "
        "tests.test_errors.test_head_name_clash_names_both_sources.<locals>.MyHead registers it again, expected a head name not taken yet, "
        "register it under another name (or pass override=True to replace the first)"
    )
    assert get_head("classification").__name__ == "ClassificationHead"
