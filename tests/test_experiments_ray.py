"""The Ray backend on a local Ray instance: same stored results as the local backend.

Needs Ray (the optional extra ``pip install 'ray[default]'``); without it the test fails with
that instruction rather than skipping silently. Marked slow: starting Ray takes ~10-20 s.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from test_experiments_sweep import DRIVER, _env, _snapshot

RAY_DRIVER = DRIVER.replace(
    'print(sweep("toy_sweep", "smoke", workers=int(sys.argv[2]), db=sys.argv[1], progress=False,\n'
    '            threads=1))',
    'import ray\n'
    'ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n'
    'print(sweep("toy_sweep", "smoke", backend=sys.argv[3], workers=int(sys.argv[2]),\n'
    '            db=sys.argv[1], progress=False, threads=1))')


@pytest.mark.slow
def test_ray_backend_stores_the_same_results_as_local_workers(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("Ray is not installed: pip install 'ray[default]' (optional extra 'ray')")
    assert "backend=sys.argv[3]" in RAY_DRIVER  # the driver above was rewritten as intended
    dbs = {}
    for backend in ("local", "ray"):
        dbs[backend] = tmp_path / f"{backend}.db"
        out = subprocess.run([sys.executable, "-c", RAY_DRIVER, str(dbs[backend]), "1", backend],
                             env=_env(), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
    local, remote = _snapshot(dbs["local"]), _snapshot(dbs["ray"])
    assert remote["counts"] == local["counts"]
    assert remote["runs"] == local["runs"]
    assert remote["metrics"] == local["metrics"]
