"""mHC hyper-connection ops: references (reference.py), custom ops (ops.py), bench cases (bench.py)."""
from .ops import h_aggregate, h_post_bda, mhc_post_pre, mhc_pre, proj_rms, sinkhorn  # noqa: F401
