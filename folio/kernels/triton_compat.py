"""The one place folio imports Triton, and the rules for when a kernel may run.

- Triton is optional: CPU installs need not have it. Without it `triton.jit` still decorates
  (so kernel files import and their torch references work) but launching raises a clear error.
- Without a CUDA device Triton can only run through its interpreter, which is decided when a
  kernel is decorated. So when no CUDA device is present we turn the interpreter on here, before
  any kernel file is imported, unless the user chose otherwise (TRITON_INTERPRET set already).
- `FOLIO_TRITON_KERNELS=0` switches every Triton kernel off: the dispatchers then take the torch
  reference even on CUDA tensors (the plain path, for bisecting a numerical difference).
- Programmatic dependent launch (PDL, Hopper and later): the decode-path kernels may start while
  the kernel before them finishes (`pdl_launch`); each such kernel calls `gdc_wait()` before it
  reads anything an earlier kernel wrote and before its first store (only weights and other
  constants may be read before the wait), and `gdc_launch_dependents()` to let the next one
  launch (`pdl_wait` does both, in that order: triggering before the wait measured 0.7 ms per
  INT4 token slower, session 9). `FOLIO_PDL=0` launches every kernel in plain stream order.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401 (kernels import these)
except ImportError:  # a CPU-only install: references only
    HAS_TRITON = False

    class _Missing:
        """Stands in for triton / triton.language so kernel files still import."""

        def __getattr__(self, name: str) -> Any:
            return None

        @staticmethod
        def jit(fn=None, **_kwargs):
            if fn is None:
                return lambda f: _MissingKernel(f)
            return _MissingKernel(fn)

    class _MissingKernel:
        def __init__(self, fn) -> None:
            self.fn = fn

        def __getitem__(self, grid):
            raise RuntimeError(
                f"Triton kernel {self.fn.__name__} needs the triton package, which is not "
                "installed; use the torch reference path (a CPU device) instead."
            )

    triton = _Missing()  # type: ignore[assignment]
    tl = _Missing()  # type: ignore[assignment]
    gdc_wait = gdc_launch_dependents = None  # type: ignore[assignment]

USE_TRITON = HAS_TRITON and os.environ.get("FOLIO_TRITON_KERNELS", "1") != "0"
if os.environ.get("FOLIO_PDL", "1") not in ("0", "1"):
    raise ValueError(f"FOLIO_PDL={os.environ['FOLIO_PDL']!r}: expected 0 (off) or 1.")
USE_PDL = os.environ.get("FOLIO_PDL", "1") == "1"
_PDL_DEVICES: dict[int, bool] = {}


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns scalars into ints with int(array of shape (1,)), which
    numpy >= 2.4 refuses, so `range(start, end)` over loaded values fails there (upstream issue
    triton-lang/triton#9171, fixed by PR #9172 after 3.6). Re-patch __index__ to squeeze first."""
    import numpy as np

    try:
        int(np.zeros(1))
        return  # older numpy: nothing to fix
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_folio_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._folio_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def _fix_interpreter_bf16_dot() -> None:
    """The interpreter keeps bfloat16 as uint16 bit patterns and its tl.dot multiplies those bits
    (triton-lang/triton#11584; upstream: bf16 arithmetic is unsupported in the interpreter). Our
    kernels upcast before every elementwise op, so only tl.dot sees bf16: convert its operands to
    float32 first, which is exact and what the tensor cores compute with a float32 accumulator."""
    import numpy as np
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_dot
    if getattr(original, "_folio_fixed", False):
        return

    def upcast(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        data = interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data.reshape(h.data.shape), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, upcast(a), upcast(b), d, input_precision, max_num_imprecise_acc)

    create_dot._folio_fixed = True  # type: ignore[attr-defined]
    builder_cls.create_dot = create_dot


def _fix_interpreter_fp8_cast() -> None:
    """Triton 3.6's interpreter casts to float8e4nv by truncating the mantissa, and a value that
    rounds up into the next binade comes out half its size (31.6 -> 16). The GPU rounds to
    nearest even (cvt.rn.satfinite): cast through torch, which does the same, instead."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._convert_float
    if getattr(original, "_folio_fixed", False):
        return
    sources = {tl.float32: np.float32, tl.float16: np.float16}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if output_dtype != tl.float8e4nv or input_dtype not in (*sources, tl.bfloat16):
            return original(input, input_dtype, output_dtype, rounding_mode)
        if input_dtype == tl.bfloat16:
            wide = (np.asarray(input).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            wide = np.asarray(input).view(sources[input_dtype]).astype(np.float32)
        t = torch.from_numpy(np.ascontiguousarray(wide)).to(torch.float8_e4m3fn)
        return t.view(torch.uint8).numpy()

    convert._folio_fixed = True  # type: ignore[attr-defined]
    interpreter._convert_float = convert


if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1":
    _fix_interpreter_scalar_index()
    _fix_interpreter_bf16_dot()
    _fix_interpreter_fp8_cast()


CPU_SMS = 132  # stands in for the SM count off CUDA (the interpreter): an H100's


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The device's SM count (what the split rules fill), read once per device; CPU_SMS off CUDA."""
    if device.type != "cuda":
        return CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def use_triton_for(x: torch.Tensor) -> bool:
    """Whether the dispatchers send this tensor to a Triton kernel (CUDA only; never the interpreter)."""
    return USE_TRITON and x.is_cuda


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Where a PDL kernel may start touching what earlier kernels wrote: waits for the kernel
    ahead (griddepcontrol.wait), then lets the next one launch; nothing without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def pdl_launch(x: torch.Tensor) -> dict[str, bool]:
    """Launch arguments for a kernel that takes the constexpr PDL: programmatic dependent launch
    on a CUDA device of compute capability >= 9 (unless FOLIO_PDL=0), plain launch otherwise
    (the interpreter, older GPUs). With PDL the kernel may start before the one ahead of it in the
    stream has finished; its gdc_wait() holds it until that kernel's writes are visible."""
    if not (USE_PDL and HAS_TRITON and x.is_cuda):
        return {"PDL": False}
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if index not in _PDL_DEVICES:
        _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if _PDL_DEVICES[index] else {"PDL": False}


def set_triton_kernels(enabled: bool) -> bool:
    """Switch the layer kernels (RMSNorm, rotary, SiLU-and-mul) between Triton and the torch
    reference at run time, as FOLIO_TRITON_KERNELS does at import; returns the previous setting.
    Takes effect for eager forwards and for CUDA graphs captured afterwards."""
    global USE_TRITON
    previous = USE_TRITON
    USE_TRITON = bool(enabled) and HAS_TRITON
    return previous


def is_interpreted(kernel: Any) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def check_same_device(kernel: Any, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and that device one the kernel can run on."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        raise ValueError(f"{kernel_name(kernel)}: tensors are on different devices: {devices}")
    if not HAS_TRITON:
        raise RuntimeError(f"{kernel_name(kernel)}: the triton package is not installed.")
    if first.type == "cpu" and not is_interpreted(kernel):
        raise ValueError(
            f"{kernel_name(kernel)}: CPU tensors run only through Triton's interpreter; set "
            "TRITON_INTERPRET=1 before folio.kernels is imported, or use the torch reference."
        )
    # triton.language imported before the interpreter was on (transformers' model classes import
    # it) keeps compiled-mode helpers (tl.cdiv, ...) that interpreted kernels cannot call.
    if first.type == "cpu" and not is_interpreted(tl.cdiv):
        raise RuntimeError(
            f"{kernel_name(kernel)}: triton.language was imported before Triton's interpreter was "
            "switched on; set TRITON_INTERPRET=1 before importing transformers or folio."
        )
    if first.type not in ("cpu", "cuda"):
        raise ValueError(f"{kernel_name(kernel)}: unsupported device {first}.")
    return first


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} must have dtype in {allowed}, got {t.dtype}.")


def kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", None)
    return getattr(fn, "__name__", None) or getattr(kernel, "__name__", "kernel")


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
