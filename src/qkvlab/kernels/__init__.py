"""Compute kernels for decoding: the same functions as PyTorch's, on faster code paths.

Decoding runs a few rows at a time through every weight, once per token, where PyTorch's
default kernels can be far from what the hardware allows. A kernel here computes the plain op's
function (to float rounding: it sums in another order; tests compare both with float64), is
chosen by measuring it against that op on the model's own weights, and runs only where a model
asks for it (inside ``generate``), so training and every other forward stay on PyTorch's ops,
bit for bit.

A kernel module offers the op, the probe that measures it against PyTorch's, and the switch
that applies the choice, a ``choice.KernelChoice``: for few-row linear products, ``gemv``
(``linear``/``Linear``, which every model's projections, MLP and unembedding use;
``decode_kernel``; ``use``; ``set_gemv_kernel`` to pin one); for one-query decode attention,
``attend`` (``decode_attention``, ``decode_attention_kernel``, ``use``,
``set_attention_kernel``), which on a CUDA device runs ``triton_decode`` (split-context
FlashDecoding in Triton, the optional ``triton`` extra, imported only there; its jitted kernels
are ``triton_jit``). Below ``attention`` and ``models``, which import it; it imports only the
leaf ``qkvlab.timing``.
"""

from qkvlab.kernels import attend, gemv
from qkvlab.kernels.attend import decode_attention, set_attention_kernel
from qkvlab.kernels.gemv import (FEW_ROWS, GEMV_KERNELS, Linear, decode_kernel, gemv_probe,
                                 linear, matrices, set_gemv_kernel)

__all__ = ["FEW_ROWS", "GEMV_KERNELS", "Linear", "attend", "decode_attention", "decode_kernel",
           "gemv", "gemv_probe", "linear", "matrices", "set_attention_kernel", "set_gemv_kernel"]
