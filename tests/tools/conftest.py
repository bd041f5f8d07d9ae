"""tk-bench runs the CP collectives' rows in this process on a world-size-1 default process
group it creates and keeps (tilekernels/cp/bench.py, so repeated rows reuse it). A test here
must not hand that group to the tests after it (they check the no-group refusals), so each
test tears down a default group it brought up."""
from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    was_up = dist.is_available() and dist.is_initialized()
    yield
    if not was_up and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
