"""``mmte serve``: a trained checkpoint behind an HTTP endpoint on LitServe, batched, with mmte's preprocessing.

* :mod:`~mmte.serve.model`: :func:`build_served` builds the model as ``mmte predict`` does (same
  command line, the checkpoint's weights and data state, predict's inference copy) and
  :class:`ServedModel` turns samples into prediction rows;
* :mod:`~mmte.serve.inputs`: requests -> samples through the data module's own preprocessing, and the
  one-line :class:`RequestError` of a bad request;
* :mod:`~mmte.serve.outputs`: the rows of ``predictions.csv`` as JSON (plus ``top_k``);
* :mod:`~mmte.serve.api`: the LitServe API (:class:`ServeAPI`) and its batching loop;
* :mod:`~mmte.serve.server`: the server (request guard, ``{"error": ...}`` answers, ``/info``, draining
  shutdown).

The LitServe modules are imported on first use of their names (``pip install 'mmte[serve]'``).
"""

from __future__ import annotations

from .inputs import InputSpec, RequestError, input_spec
from .model import RUNTIMES, ServedModel, build_served
from .outputs import prediction_rows

__all__ = [
    "RUNTIMES",
    "InputSpec",
    "RequestError",
    "ServeAPI",
    "ServedModel",
    "build_served",
    "input_spec",
    "prediction_rows",
    "run_server",
]


def __getattr__(name: str):
    if name == "ServeAPI":
        from .api import ServeAPI

        return ServeAPI
    if name == "run_server":
        from .server import run_server

        return run_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
