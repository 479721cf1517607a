"""Non-finite checks where data is read: the first bad value named by file, row and column."""

from __future__ import annotations

import numpy as np

from ..errors import NonFiniteError

__all__ = ["FLOAT32_MAX", "check_finite_table"]

FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_finite_table(values: np.ndarray, columns: list[str], where: str, allow_nan: bool = False, row_offset: int = 0) -> None:
    """Raise :class:`~mmte.errors.NonFiniteError` at the first value of ``values`` ``[rows, columns]`` that is
    infinite, NaN (unless ``allow_nan``: NaN means missing) or beyond float32's range (it would become inf).

    Args:
        values: numbers (any float dtype; float64 keeps values float32 cannot hold).
        columns: the column names, for the message.
        where: the file (or table) name, for the message.
        allow_nan: NaN is a missing value, not an error.
        row_offset: added to the row index in the message (e.g. a split's first row).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[:, None]
    bad = np.isinf(v) | (np.abs(np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)) > FLOAT32_MAX)
    if not allow_nan:
        bad |= np.isnan(v)
    if not bad.any():
        return
    r, c = (int(i[0]) for i in np.nonzero(bad))
    x = float(v[r, c])
    n = int(bad.sum())
    why = "beyond float32's range (|x| <= 3.4e38), it would become inf" if np.isfinite(x) else "not finite"
    raise NonFiniteError(
        f"{where}: row {r + row_offset}, column {columns[c]!r} is {x!r} ({why}; {n} such value(s) in all)",
        "expected finite numbers" + (" (an empty cell is a missing value)" if allow_nan else ""),
        "fix or drop those rows, or rescale the column",
    )
