"""pytest plugin for device calls that may be cut off: prints each failure's report the moment it arrives
(with xdist too, since the controller gets every report) and each test's start, so a capped call still names
what failed, why, and what hung. Use: PYTHONPATH=benchmarks/probes:$PYTHONPATH pytest -p instafail ..."""
import sys


def pytest_runtest_logreport(report):
    if report.failed:
        sys.stderr.write(f"\n===== INSTAFAIL {report.nodeid} ({report.when})\n{report.longreprtext}\n=====\n")
        sys.stderr.flush()
    elif report.when == "call" and report.passed:
        sys.stderr.write(f"ok {report.nodeid} {report.duration:.1f}s\n")
        sys.stderr.flush()
