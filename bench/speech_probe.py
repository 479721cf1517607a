"""How much of the speaker recipe's accuracy the pretrained speech embedding brings by itself: a linear probe.

For every FSDD clip, mmte's speech-embedding stem (``mmte.tokenizers.speech_embedding``, the weights of the
openwakeword 0.4.0 wheel) turns the ``frontend: speech_embedding`` log-mel, extended as the audio tokenizer
does (38 / 37 frames of the clip's quietest level), into one 96-d vector every 80 ms; the vectors are pooled
(mean and max over the clip) and a standardised logistic regression is fitted on four speakers and scored on
the fifth (leave-one-speaker-out, all five folds, no augmentation, no tuning on the held-out speaker).
Next to it, the same probe on the pooled Kaldi fbank (the bench's first audio baseline): what the pretrained
network adds before any transformer.

    python bench/speech_probe.py [--data ../shared/data] [--out bench/results/speech_probe.json] [--update-doc]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc


def features(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Pooled speech-embedding vectors ``[N, 192]`` and pooled Kaldi fbank ``[N, 128]`` of the clips."""
    from mmte.data.audio import compute_fbank, load_audio
    from mmte.tokenizers.audio import _with_context
    from mmte.tokenizers.speech_embedding import SpeechEmbedding

    net = SpeechEmbedding().eval()
    emb, fb = [], []
    with torch.inference_mode():
        for p in paths:
            w, sr = load_audio(p)
            mel = compute_fbank(w, sr, 16000, 32, frontend="speech_embedding")
            v = net(_with_context(mel[None], None))[0]
            emb.append(torch.cat([v.mean(0), v.amax(0)]).numpy())
            k = compute_fbank(w, sr, 8000, 64, mean=None, std=None)
            fb.append(torch.cat([k.mean(0), k.std(0)]).numpy())
    return np.stack(emb), np.stack(fb)


def loso(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = {}
    for g in sorted(set(groups)):
        tr = groups != g
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)).fit(x[tr], y[tr])
        out[g] = float(clf.score(x[~tr], y[~tr]))
    out["mean"] = float(np.mean(list(out.values())))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "speech_probe.json")
    _doc.add_argument(ap, "speech_probe")
    args = ap.parse_args(argv)
    rec = args.data / "fsdd" / "recordings"
    paths = sorted(os.fspath(p) for p in rec.glob("*.wav"))
    if not paths:
        raise SystemExit(f"no FSDD clips under {rec}")
    meta = [re.match(r"(\d+)_([a-z]+)_", os.path.basename(p)).groups() for p in paths]
    y, groups = np.array([int(d) for d, _ in meta]), np.array([s for _, s in meta])
    t0 = time.time()
    emb, fb = features(paths)
    res = {"speech_embedding": loso(emb, y, groups), "kaldi_fbank": loso(fb, y, groups), "clips": len(paths),
           "seconds": round(time.time() - t0), "torch": torch.__version__, "machine": platform.machine()}
    table = _doc.md_table(["held-out speaker", "speech embedding, pooled, logistic regression", "Kaldi fbank, pooled, logistic regression"],
                          [[g, f"{res['speech_embedding'][g]:.3f}", f"{res['kaldi_fbank'][g]:.3f}"] for g in [*sorted(set(groups)), "mean"]],
                          align="lrr")
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    if args.update_doc:
        note = (f"\n\nLeave-one-speaker-out over FSDD's five speakers ({len(paths)} clips, {res['seconds']} s for the features and fits): "
                "a standardised logistic regression on each clip's pooled vectors (mean and max) of mmte's speech-embedding stem, "
                "beside the same probe on the pooled Kaldi fbank. It shows what the pretrained speech network gives before any "
                "transformer; the audio recipe's figure is in the generalisation section.")
        _doc.update_doc("speech_probe", table + note, _doc.command_line("bench/speech_probe.py", argv), args.update_doc,
                        machine=_doc.machine_line(note=f"torch threads: {torch.get_num_threads()}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
