#!/usr/bin/env python3
"""Device host: the gdn_decode GPU tests with a config variant as the heuristic's default, so a
candidate default is tested at every shape and dv tile the tests use (the PF lesson: a setting
correct at one BV and wrong at another). One variant per process, e.g. under a time limit:

    timeout 110 python3 benchmarks/probes/gdn_decode_variant_tests.py f-FUSE -k "not kernel_variant"

The name is one of benchmarks/gdn_decode_check.py's VARIANTS (state dtype, changes): the changes
apply to heuristic configs of that state dtype (the other dtype keeps the default); a change the
config refuses at some shape (``wrong_result_risk``) is left out there. The remaining arguments
go to pytest (``-m gpu`` and the decode test file are added).
"""
from __future__ import annotations

import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import pytest  # noqa: E402

import gdn_decode_check as gc  # noqa: E402
from tilekernels.gdn import cutile_decode as cd  # noqa: E402


def patch(name: str) -> None:
    sdn, changes, _, _ = gc.VARIANTS[name]
    want = 4 if sdn == "fp32" else 2
    orig = cd.DecodeCfg.heuristic

    def heuristic(Hk, Hv, dk, dv, W, state_bytes=4):
        cfg = orig(Hk, Hv, dk, dv, W, state_bytes)
        if state_bytes != want:
            return cfg
        try:
            return dataclasses.replace(cfg, **changes)
        except ValueError:  # refused at this shape: the default there
            return cfg

    cd.DecodeCfg.heuristic = staticmethod(heuristic)


if __name__ == "__main__":
    name = sys.argv[1]
    patch(name)
    print("variant", name, gc.VARIANTS[name], flush=True)
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-m", "gpu", os.path.join(ROOT, "tests/gdn/test_gdn_cutile_decode.py"),
                          *sys.argv[2:]]))
