"""``train.memory.keep_freed_memory``: where the C library is glibc, a large tensor freed and
allocated again comes back from the heap, not from fresh pages the kernel faults in."""

import resource
import sys

import pytest
import torch

from qkvlab.train.memory import keep_freed_memory


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_a_large_tensor_allocated_again_faults_no_new_pages():
    if not keep_freed_memory():
        pytest.skip("the C library is not glibc: nothing is set")
    assert keep_freed_memory() is True  # once per process, the same answer after
    n = 16 * 2**20  # 64 MiB of fp32: above glibc's largest mmap threshold (32 MiB)
    x = torch.empty(n)
    x.fill_(1.0)  # its pages are touched, so they are in the heap when it is freed
    del x
    before = _faults()
    y = torch.empty(n)
    y.fill_(2.0)
    # mmap'd, this would fault each of its 16,384 pages in again
    assert _faults() - before < 512
    assert torch.equal(y, torch.full((n,), 2.0))
