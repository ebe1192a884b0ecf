"""The one environment recorder: the fields every run and the report record, and that the
module sits below everything else in qkvlab (no imports from it at module level)."""

from __future__ import annotations

import ast
import platform
import subprocess
import sys
from pathlib import Path

import torch

import qkvlab
from qkvlab import env
from qkvlab.experiments import worker


def test_environment_has_versions_hardware_git_and_platform():
    e = env.environment()
    assert set(e) == {"versions", "hardware", "git_rev", "platform"}
    assert set(e["versions"]) == {"qkvlab", "torch", "numpy", "safetensors", "scipy", "python"}
    assert e["versions"]["qkvlab"] == qkvlab.__version__ and e["versions"]["torch"] == torch.__version__
    assert set(e["hardware"]) == {"machine", "processor", "cpu_model", "system", "cpu_count",
                                  "torch_threads", "cuda", "cpu_capability"}
    assert e["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert e["platform"] == platform.platform()
    assert e["git_rev"] is None or len(e["git_rev"].split("+")[0]) == 40


def test_cpu_model_reads_proc_cpuinfo():
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    assert env.cpu_model() == (names[0] if names else platform.processor() or None)


def test_runs_record_the_same_environment():
    assert worker.environment is env.environment


def test_env_imports_nothing_from_qkvlab_at_module_level():
    tree = ast.parse(Path(env.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] == "qkvlab"]
    # and importing it first, in a fresh interpreter, works and records qkvlab's version
    code = "import qkvlab.env as e; print(e.environment()['versions']['qkvlab'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == qkvlab.__version__
