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
        self.hint, self.msg = hint, msg
        # no super().__init__(msg): args stay the constructor's (op, item, ...), which is what
        # TorchDynamo shows when a traced call is refused; __str__ gives the message

    def __str__(self) -> str:
        return self.msg


class BackendUnavailable(SpecError):
    """A forced backend (or strict mode's auto) whose requirements do not hold."""
