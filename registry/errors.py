"""The registry's one exception type."""
from __future__ import annotations

from typing import Any, Optional


class SpecError(ValueError):
    """An input, param or backend request an op's spec refuses.

    The message always names the op, the offending tensor/param/constraint,
    what was expected and what was got. Raised before any kernel launches.
    """

    def __init__(self, op: str, item: str, expected: Any, got: Any, hint: Optional[str] = None):
        self.op, self.item, self.expected, self.got = op, item, expected, got
        msg = f"{op}: {item}: expected {expected}, got {got}"
        if hint:
            msg += f" ({hint})"
        self.hint = hint
        self.args = (msg,)  # (not super().__init__: TorchDynamo traces this when a compiled call is refused)

    def __reduce__(self):
        return type(self), (self.op, self.item, self.expected, self.got, self.hint)


class BackendUnavailable(SpecError):
    """A forced backend (or strict mode's auto) whose requirements do not hold."""
