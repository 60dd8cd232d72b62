"""Errors raised while reading a checkpoint; messages name the file or range and say what to do."""


class CheckpointError(ValueError):
    """A checkpoint folder cannot serve the requested layers (missing, corrupt or out of range)."""


class UnsupportedModelError(CheckpointError):
    """The checkpoint is of a model family (or RoPE variant) that `shards` does not implement."""
