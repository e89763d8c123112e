"""A prefix that several rows of a batch share, computed once: GRPO's G completions of a prompt all start with it.

`MiniMindModel(..., shared_prefix_length=P)` finds, by content, the rows whose first P token ids and attention-mask
values are equal (`SharedPrefix.find`), runs the layers once over one copy of each distinct prefix, keeping each
layer's keys and values (`PrefixKeysValues.record`), then runs the rows' remaining tokens with every row's prefix
keys and values put before its own (`PrefixReader`). Attention is causal, so the prefix's hidden states never depend
on what follows it; the result equals the plain forward up to summation order, and the backward sums each row's
gradient into its prefix once.

Shipped beside ``modeling_minimind.py`` in saved folders, so, like it, this module imports nothing from
``minimind_trl``.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SharedPrefix:
    """Which rows share their first `length` tokens: `rows` holds one row per distinct prefix (its first occurrence),
    `row_prefix` maps every row to its prefix's index in `rows`."""

    length: int
    rows: torch.Tensor
    row_prefix: torch.Tensor

    @classmethod
    def find(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int) -> "SharedPrefix | None":
        """The rows' distinct prefixes (ids and mask both equal), or None when no two rows share theirs."""
        prefixes = torch.cat([input_ids[:, :length], attention_mask[:, :length].to(input_ids.dtype)], dim=1)
        distinct, row_prefix = torch.unique(prefixes, dim=0, return_inverse=True)
        count = input_ids.shape[0]
        if distinct.shape[0] == count:
            return None
        order = torch.arange(count, device=input_ids.device)
        rows = torch.full((distinct.shape[0],), count, dtype=torch.long, device=input_ids.device)
        rows = rows.scatter_reduce(0, row_prefix, order, reduce="amin")
        return cls(length, rows, row_prefix)

    def per_row(self, prefix_values: torch.Tensor) -> torch.Tensor:
        """`[distinct prefixes, ...]` -> `[rows, ...]` (a gather: its backward adds every row's gradient into its
        prefix)."""
        return prefix_values.index_select(0, self.row_prefix)


class PrefixKeysValues:
    """The prefix pass's attention keys and values, layer by layer (passed to the attention as `shared_prefix`).

    A layer recomputed by activation checkpointing records again; the suffix pass reads a `reader()` snapshot taken
    before that, so it always attends to the forward's own tensors."""

    def __init__(self, prefix: SharedPrefix):
        self.prefix = prefix
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.layers[layer_idx] = (key, value)
        return key, value

    def reader(self) -> "PrefixReader":
        return PrefixReader(self.prefix, dict(self.layers))


class PrefixReader:
    """For the suffix pass: every row's prefix keys and values (gathered from the distinct prefixes), then its own."""

    def __init__(self, prefix: SharedPrefix, layers: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        self.prefix = prefix
        self.layers = layers

    def __call__(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prefix_key, prefix_value = self.layers[layer_idx]
        key = torch.cat([self.prefix.per_row(prefix_key), key], dim=-2)
        value = torch.cat([self.prefix.per_row(prefix_value), value], dim=-2)
        return key, value
