"""A fake GPU backend module for registry tests (registers nothing on import
unless asked), plus a torch entry that records calls."""
import torch

CALLS = []


def entry(x, y=None, *, backend, scale=1.0, mode="a", n_heads=None):
    CALLS.append(backend)
    return x * scale


def traced_entry(x, y=None, *, backend, scale=1.0, mode="a", n_heads=None):
    """``entry`` without the call record (a list dynamo would guard on, one graph per call)."""
    return x * scale


def reference(x, y=None, *, scale=1.0, mode="a", n_heads=None):
    return x * scale
