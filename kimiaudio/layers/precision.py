"""Float32 computed in float32 on CUDA.

PyTorch runs float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), and
float32 matmuls too where the matmul precision was lowered: a 10-bit mantissa, so a float32
stack's detokenizer drifted from the official goldens by up to 6.3e-4 (their tolerance is
1e-4). A float32 run (what the goldens and `dtype = float32` ask for) turns TF32 off for both;
a bf16 run is left as it is (its bf16 kernels are not TF32's to change, and the float32 parts
beside them, the GLM encoder, keep the speed they had). The flags are the process's: the
stack's loaders set them once, before anything runs.
"""

from __future__ import annotations

import torch


def exact_float32(device: torch.device, dtype: torch.dtype) -> bool:
    """Turn TF32 off for CUDA matmuls and convolutions when `dtype` is float32 on CUDA; return
    whether it did (False: nothing changed)."""
    if device.type != "cuda" or dtype != torch.float32:
        return False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return True
