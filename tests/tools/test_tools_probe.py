"""tk-probe: text and JSON reports, driver error handling, static backend reasons."""
import json
import os
import subprocess
import sys
import types

import torch

import registry
from tools import _common as C
from tools import probe

ROOT = C.REPO_ROOT


def test_text_report_names_every_op(capsys):
    assert probe.main([]) == 0
    out = capsys.readouterr().out
    for section in ("== host", "== torch", "== driver (cuda-python)", "== cuTile", "== CuTe DSL", "== ops"):
        assert section in out
    for name in registry.names():
        assert name in out
    if not torch.cuda.is_available():
        assert "torch sees no CUDA device" in out


def test_json_report_has_every_op_with_backend_and_reason(capsys):
    assert probe.main(["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert {"host", "torch", "gpus", "driver", "cutile", "cute", "ops", "git_commit"} <= set(r)
    assert {"hostname", "os", "python", "cpu_count"} <= set(r["host"])
    assert r["torch"]["version"] == torch.__version__
    assert {"importable", "version", "tileiras", "versions_match", "arch"} <= set(r["cutile"])
    assert {"importable", "version", "arch"} <= set(r["cute"])
    seen = {o["op"] for o in r["ops"]}
    assert seen == set(registry.names())
    for o in r["ops"]:
        names = [b.name for b in registry.get(o["op"]).spec.backends]
        assert o["fwd"]["backend"] in names, o
        assert o["fwd"]["reason"], o
        assert [b["name"] for b in o["fwd"]["backends"]] == names
        if not torch.cuda.is_available():
            assert o["fwd"]["backend"] == "torch"
            assert all(not b["ok"] for b in o["fwd"]["backends"] if b["name"] != "torch")
    agg = [o for o in r["ops"] if o["op"] == "mhc_h_aggregate"]
    assert agg and agg[0]["source"] == "bench case" and "fwd+bwd" in agg[0]
    if not torch.cuda.is_available():
        assert r["gpus"] == [] and r["driver"]["ok"] is False and r["driver"]["error"]


def test_missing_cuda_python_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setattr(probe, "_cuda_driver_module", lambda: (None, "cuda-python is not installed (test)"))
    d = probe.driver_info()
    assert d["ok"] is False and "not installed" in d["error"]
    assert probe.main([]) == 0
    assert "cuda-python is not installed (test)" in capsys.readouterr().out


class _Err(int):
    pass


def _fake_driver(init_code=0, count=1):
    names = {0: b"CUDA_SUCCESS", 100: b"CUDA_ERROR_NO_DEVICE"}
    attr = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="maj",
                                 CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="min")
    return types.SimpleNamespace(
        cuInit=lambda flags: (_Err(init_code),),
        cuGetErrorName=lambda e: (_Err(0), names[int(e)]),
        cuDriverGetVersion=lambda: (_Err(0), 12080),
        cuDeviceGetCount=lambda: (_Err(0), count),
        cuDeviceGet=lambda i: (_Err(0), i),
        cuDeviceGetName=lambda n, dev: (_Err(0), b"Fake GPU\0\0\0"),
        cuDeviceGetAttribute=lambda a, dev: (_Err(0), 9 if a == "maj" else 0),
        cuDeviceTotalMem=lambda dev: (_Err(0), 80 * 2**30),
        CUdevice_attribute=attr,
    )


def test_driver_without_device_gives_a_clear_message(monkeypatch):
    monkeypatch.setattr(probe, "_cuda_driver_module", lambda: (_fake_driver(init_code=100), None))
    d = probe.driver_info()
    assert d["ok"] is False
    assert "cuInit failed: CUDA_ERROR_NO_DEVICE" in d["error"]


def test_driver_facts_are_decoded(monkeypatch):
    monkeypatch.setattr(probe, "_cuda_driver_module", lambda: (_fake_driver(count=2), None))
    d = probe.driver_info()
    assert d["ok"] is True and d["error"] is None
    assert d["cuda_driver_api"] == "12.8" and d["device_count"] == 2
    assert d["devices"][1] == {"index": 1, "name": "Fake GPU", "sm": "sm_90", "memory_gib": 80.0}


def test_tool_version_parsing_and_release_match(tmp_path):
    tool = tmp_path / "tileiras"
    tool.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.5, V13.5.37'\n")
    tool.chmod(0o755)
    assert probe._tool_version(str(tool)) == ("13.5.37", None)
    assert probe._tool_version(None) == (None, None)
    bad = tmp_path / "broken"
    bad.write_text("#!/bin/sh\necho nope\n")
    bad.chmod(0o755)
    ver, err = probe._tool_version(str(bad))
    assert ver is None and "unrecognised" in err
    assert probe._same_release("13.5.37", "13.5.37") and not probe._same_release("13.5.37", "13.0.88")


def test_static_reasons_for_a_gpu_backend_without_a_gpu():
    from specs.schema import OpSpec

    d = registry.get("mhc_h_aggregate").spec.model_dump()
    d["backends"] = [{"name": "cutile", "module": "tilekernels.mhc.ops", "toolchain": ["cutile"], "sm": (90, 100)},
                     *(b for b in d["backends"] if b["name"] == "torch")]
    spec = OpSpec.model_validate(d)
    res = dict((n, (ok, why)) for n, ok, why in probe._static_backends(spec, torch.device("cpu"), None))
    assert res["torch"][0] is True
    assert res["cutile"][0] is False and "needs a CUDA device" in res["cutile"][1]
    res = dict((n, (ok, why)) for n, ok, why in probe._static_backends(spec, torch.device("cuda"), 80))
    assert res["cutile"][0] is False and "sm_80" in res["cutile"][1]
    choice = probe._choice(probe._static_backends(spec, torch.device("cpu"), None))
    assert choice["backend"] == "torch" and choice["rejected"][0].startswith("cutile: ")


def test_arch_support_uses_targets():
    a = probe._arch_support("cutile", [80, 90, 100])
    assert a["devices"] == {"sm_80": False, "sm_90": True, "sm_100": True}


def test_cli_subprocess_json():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tools.probe", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert {o["op"] for o in r["ops"]} == set(registry.names())


def test_collectives_are_explained_on_a_group_the_probe_ends_and_says_so(caplog):
    # the probe made a world-size-1 group through the CP bench case, kept it, and said "auto -> torch reference"
    # for ops that, in a process without a group, no backend can run; their torch backend is not the reference
    import logging

    import torch.distributed as dist

    from registry import core

    had = dist.is_initialized()
    ops, _ = probe.ops_info(torch.device("cpu"))
    assert dist.is_initialized() == had
    cp_ops = [o for o in ops if o["op"] in ("thd_cp_to_hp", "thd_hp_to_cp")]
    assert len(cp_ops) == 2
    for o in cp_ops:
        assert had or "without one no backend of this op is usable" in o["note"], o
        assert o["fwd"]["backend"] == "torch" and "not the reference" in o["fwd"]["reason"], o
        assert "with a torch.distributed process group" in o["fwd"]["reason"], o
    perm = next(o for o in ops if o["op"] == "thd_cp_a2a_perm")
    assert "note" not in perm and "not the reference" in perm["fwd"]["reason"]
    agg = next(o for o in ops if o["op"] == "mhc_h_aggregate")
    assert agg["fwd"]["reason"].startswith(("torch reference", "cutile", "cute")), agg
    # the fallback log names it the same way (thd_cp_to_hp's cuTile backend refused: CPU tensors)
    from tilekernels.cp.bench import _single_process_group

    _single_process_group(torch.device("cpu"))
    core._warned.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="tilekernels"):
            registry.get("thd_cp_to_hp")(torch.randn(4, 2), torch.tensor([0, 4], dtype=torch.int32))
    finally:
        if not had:
            dist.destroy_process_group()
    assert any("falling back to the torch backend (its own torch code, not the reference)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
