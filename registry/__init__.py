"""The op registry: ``get(name) -> Op``, ``names()``, validation and dispatch.

>>> import registry
>>> op = registry.get("mhc_h_aggregate")
>>> y = op(x, h_pre)                       # validates, then picks a backend
>>> op.explain(x, h_pre)                   # [(backend, ok, reason), ...]
"""
from .core import Op, backend_status, clear_caches, get, names, strict  # noqa: F401
from .errors import BackendUnavailable, SpecError  # noqa: F401
from .validate import Bound, bind  # noqa: F401
