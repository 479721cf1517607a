"""A digits data module whose test split cannot be built: a run that reads it fails loudly."""

from mmte.training import ArrayDataModule


class NoTestSplitArrays(ArrayDataModule):
    """:class:`ArrayDataModule` that refuses to build its test split (``mmte tune`` must never read it)."""

    def build_split(self, split: str) -> None:
        if split == "test":
            raise RuntimeError("the test split was read")
        super().build_split(split)
