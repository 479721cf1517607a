"""Write a small synthetic ECG data set for examples/ecg.py: ``<folder>/<class>_<i>.npy`` files.

Two classes at 250 Hz, 4 s each, 50-110 beats/min with a little jitter: ``normal`` beats (a narrow
QRS complex, about 80 ms) and ``wide`` ones (about 160 ms, as in a bundle branch block). Each beat is a
Gaussian QRS spike with a smaller T wave; baseline wander and noise are added.

    python examples/ecg_data.py runs/ecg_data --per_class 40
"""

from __future__ import annotations

import argparse
import os

import numpy as np

RATE, SECONDS = 250, 4


def synth_ecg(wide: bool, rng: np.random.Generator) -> np.ndarray:
    """One lead, ``RATE * SECONDS`` float32 samples."""
    t = np.arange(RATE * SECONDS) / RATE
    rr, qrs = 60.0 / rng.uniform(50, 110), (0.04 if wide else 0.02) * rng.uniform(0.9, 1.1)
    beats, b = [], rng.uniform(0, rr)
    while b < SECONDS:
        beats.append(b)
        b += rr * rng.uniform(0.95, 1.05)
    x = sum(np.exp(-(((t - b) / qrs) ** 2)) + 0.3 * np.exp(-(((t - b - 0.3) / 0.06) ** 2)) for b in beats)
    x = x + 0.1 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * t) + 0.05 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def write_folder(folder: str, per_class: int = 40, seed: int = 0) -> list[str]:
    """Write ``per_class`` files of each class into ``folder``; returns their paths."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(per_class):
        for label in ("normal", "wide"):
            paths.append(os.path.join(folder, f"{label}_{i:03d}.npy"))
            np.save(paths[-1], synth_ecg(label == "wide", rng))
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--per_class", type=int, default=40)
    a = p.parse_args()
    print(f"wrote {len(write_folder(a.folder, a.per_class))} files to {a.folder}")
