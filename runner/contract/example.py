"""One tokenized training example: what the model reads and which tokens carry loss."""

from __future__ import annotations

from dataclasses import dataclass

IGNORE_INDEX = -100  # the label transformers' loss skips


@dataclass
class Example:
    """Token ids and labels of one record; labels are IGNORE_INDEX where no loss is taken."""

    input_ids: list[int]
    labels: list[int]
    source_line: int

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise ValueError("input_ids and labels must have the same length")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def trainable_tokens(self) -> int:
        """Tokens whose prediction is trained; the first label is never predicted by a causal LM."""
        return sum(1 for label in self.labels[1:] if label != IGNORE_INDEX)
