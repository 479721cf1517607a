"""mmte.data: framework-free preprocessing and collate functions, one module per modality.

Each modality module turns raw inputs (files, arrays) into one sample and collates samples into the
batch value its tokenizer takes; :func:`collate_batch` assembles the model's batch dict.
"""

from .collate import collate_batch, pad_stack, stack_same

__all__ = ["collate_batch", "pad_stack", "stack_same"]
