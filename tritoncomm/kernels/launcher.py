"""Launching a Triton kernel with little host time: ``Launcher``.

``kernel[grid](*args, **kw)`` re-derives on every call what Triton needs to find its compiled kernel:
it binds every argument, specialises each one, builds a cache key around the printed options,
checks the kernel's globals and prepares profiler metadata. For kernels of 12-20 arguments that is
most of an eager collective's host time.

A ``Launcher`` serves one kernel on one grid. The first call with a given *signature* goes through
Triton (compiling if needed) and keeps the compiled kernel Triton returned; later calls with the
same signature hand the arguments to that compiled kernel's launcher: its C entry point directly where
Triton built one for CUDA and the kernel needs no scratch memory and takes no tensor descriptors
(``direct``), else Triton's Python wrapper around it. The signature is the current device, the
keyword arguments with their values (constexprs and options such as ``num_warps``), and, per
positional argument, the specialisation Triton computes for it with specialisation and alignment on
(``native_specialize_impl``: dtype, 16-byte alignment, integer width, the value 1). That is at
least as fine as what Triton keys its own cache on, so a call takes the short path only when Triton
would have chosen the same compiled kernel.

Rules:

* Positional arguments are the kernel's runtime parameters, in order; constexprs and launch options
  go by keyword. A call that passes a runtime parameter by keyword, or whose positional arguments reach
  a constexpr parameter, goes through Triton.
* Triton's own path is taken under the interpreter (the CPU world), while a launch hook is installed
  (profilers such as proton), for more than ``MAX_SIGNATURES`` signatures, and wherever Triton's
  internals differ from those this was written against (``FAST`` is then False).
* The short path skips Triton's check that the kernel's global values are unchanged since it was
  compiled: kernels launched this way must not read globals that change.

**Triton's C entry point changes between releases** (``ABIS``). Up to 3.6 it takes the launch
fields, the scratch buffers and then the kernel's arguments one by one (``"args"``, a C function
generated per signature); from 3.7 one generic entry takes them as a tuple, after the argument
annotations and the kernel signature Triton's wrapper holds (``"tuple"``). The release is read
once, at import: a release not in ``ABIS`` takes Triton's own path for every launch (``FAST`` is
False, and this is logged once). A compiled kernel whose wrapper lacks what its release's entry
needs, or that needs what the short path does not pass (scratch memory, tensor descriptors,
GSan instrumentation), goes through that wrapper (``kernel.run``). Should the entry still refuse
the arguments (a ``TypeError`` raised before anything is launched), that signature goes through
the wrapper from then on, logged once per launcher: no call fails for it.
"""

from __future__ import annotations

import logging
import types
from types import MappingProxyType
from typing import Any

import triton

log = logging.getLogger("tritoncomm")

#: The C launch entry of each Triton release (major, minor) this module calls directly (docstring).
ABIS = MappingProxyType({(3, 6): "args", (3, 7): "tuple", (3, 8): "tuple", (3, 9): "tuple"})


def triton_release(version: str = triton.__version__) -> tuple[int, int]:
    """``(major, minor)`` of a Triton version string (``"3.8.0"``, ``"3.9.0+git1234"``); (0, 0) if unreadable."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or "x")
    except ValueError:
        return 0, 0


#: This process's Triton's entry (``ABIS``), or None where its release is not known.
ABI = ABIS.get(triton_release())

try:  # Triton internals the short path relies on; without them every launch goes through Triton.
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, native_specialize_impl

    FAST = ABI is not None and all(hasattr(knobs.runtime, h) for h in ("launch_enter_hook", "launch_exit_hook"))
except ImportError:  # pragma: no cover - other Triton versions
    FAST = False

if ABI is None:
    log.info("tritoncomm: Triton %s's launch entry is not one this release knows (%s); every kernel launches "
             "through Triton's public path", triton.__version__, ", ".join(f"{a}.{b}" for a, b in ABIS))

__all__ = ["ABI", "ABIS", "FAST", "MAX_SIGNATURES", "Launcher", "triton_release"]

#: Signatures one launcher keeps; past this many, new ones go through Triton every time.
MAX_SIGNATURES = 64


def _hook_idle(hook: object) -> bool:
    return hook is None or not getattr(hook, "calls", True)


def _c_entry(kernel: Any, abi: str | None = ABI) -> tuple[Any, bool, bool, tuple] | None:
    """``(launch, cooperative, pdl, extra)`` when ``kernel``'s launcher is Triton's CUDA launcher
    around a C entry point of ``abi`` and the kernel needs nothing the short path leaves out; else
    None. ``extra``: what the ``"tuple"`` entry takes after the scratch buffers and before the
    arguments (the annotations and the kernel signature). Left out: scratch memory (the wrapper
    allocates it per launch), tensor descriptors (the wrapper builds them, so its ``launch`` is a
    Python function, not the C entry) and GSan (extra arguments)."""
    run = kernel.run
    launch = getattr(run, "launch", None)
    if abi is None or not isinstance(launch, types.BuiltinFunctionType) or getattr(run, "global_scratch_size", 1) \
            or getattr(run, "profile_scratch_size", 1) or getattr(run, "gsan_enabled", False):
        return None
    has_tuple = hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature")
    if abi == "tuple" and has_tuple:
        return launch, bool(run.launch_cooperative_grid), bool(run.launch_pdl), (run.arg_annotations,
                                                                                 run.kernel_signature)
    if abi == "args" and not has_tuple:
        return launch, bool(run.launch_cooperative_grid), bool(run.launch_pdl), ()
    return None


class Launcher:
    """Launch ``fn`` (a ``@triton.jit`` kernel) on ``grid``: ``launcher(*args, **kwargs)`` does what
    ``fn[grid](*args, **kwargs)`` does, with less host time once a signature has been launched
    (module docstring). Host-only, no allocation; one per (kernel, grid), owned by whatever
    launches it."""

    def __init__(self, fn: Any, grid: tuple[int, ...]) -> None:
        if not isinstance(grid, tuple) or not 1 <= len(grid) <= 3 or any(not isinstance(g, int) for g in grid):
            raise TypeError(f"Launcher: grid must be a tuple of 1-3 ints, got {grid!r}")
        self.fn, self.grid = fn, grid
        self._dims = (*grid, 1, 1)[:3]
        self._cache: dict[tuple, tuple[Any, tuple, tuple[Any, bool, bool, tuple] | None]] = {}
        self.fast = FAST and isinstance(fn, JITFunction) and hasattr(fn, "device_caches")
        if self.fast:
            params = fn.params
            #: How many leading parameters are runtime ones (positional arguments may fill only these).
            self._positional = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
            self._names = tuple(p.name for p in params)
            #: Runtime parameters: passed by keyword, they send the call through Triton (the signature
            #: would have to hold the value itself, and keep a tensor alive).
            self._runtime_names = frozenset(p.name for p in params if not p.is_constexpr)
            self._defaults = {p.name: p.default for p in params if p.has_default}
            self._device = driver.active.get_current_device
            self._stream = driver.active.get_current_stream
            self._backend: Any = None  # Triton's backend object for the device, after the first launch
        #: Whether the short path calls the C entry point itself where it can (``_c_entry``).
        self.direct = True
        #: Launches that took the short path (tests and benchmarks read it).
        self.short_launches = 0
        #: Signatures whose C entry refused their arguments (module docstring; each then took the wrapper).
        self.refused = 0

    def _direct(self, entry: tuple[Any, bool, bool, tuple], stream: int, kernel: Any, values: tuple) -> None:
        """Call Triton's C entry point (``_c_entry``) as its release's wrapper does, with no scratch,
        no launch metadata and no hooks."""
        launch, coop, pdl, extra = entry
        g0, g1, g2 = self._dims
        if extra:  # "tuple": annotations, signature, then the arguments as one tuple
            launch(g0, g1, g2, stream, kernel.function, coop, pdl, kernel.packed_metadata, None, None, None, None,
                   None, *extra, values)
        else:  # "args": scratch before the wrapper's fields, then the arguments one by one
            launch(g0, g1, g2, stream, kernel.function, coop, pdl, None, None, kernel.packed_metadata, None, None,
                   None, *values)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self.fast and len(args) <= self._positional and self._runtime_names.isdisjoint(kwargs) \
                and _hook_idle(knobs.runtime.launch_enter_hook) and _hook_idle(knobs.runtime.launch_exit_hook):
            dev = self._device()
            if self._backend is None:  # Triton's per-device state exists once it has launched here
                self.fn[self.grid](*args, **kwargs)
                self._backend = self.fn.device_caches[dev][3]
                return
            key = self._key(dev, args, kwargs)
            try:
                hit = self._cache.get(key)
            except TypeError:  # an unhashable constexpr or option value: Triton's path
                self.fn[self.grid](*args, **kwargs)
                return
            if hit is not None:
                kernel, tail, entry = hit
                g0, g1, g2 = self._dims
                stream = self._stream(dev)
                if entry is not None and self.direct:
                    try:
                        self._direct(entry, stream, kernel, (*args, *tail))
                    except TypeError as exc:  # the entry refused the arguments: nothing was launched
                        self._cache[key] = (kernel, tail, None)
                        if not self.refused:
                            log.warning("tritoncomm: Triton %s's launch entry refused %s's arguments (%s); that "
                                        "signature launches through Triton's wrapper", triton.__version__,
                                        getattr(self.fn, "__name__", self.fn), exc)
                        self.refused += 1
                        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
                                   *args, *tail)
                else:
                    kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
                               *args, *tail)
                self.short_launches += 1
                return
            kernel = self.fn[self.grid](*args, **kwargs)
            if hasattr(kernel, "result"):  # compiled asynchronously
                kernel = kernel.result()
            if len(self._cache) < MAX_SIGNATURES:
                self._cache[key] = (kernel, self._tail(len(args), kwargs), _c_entry(kernel))
            return
        self.fn[self.grid](*args, **kwargs)

    def compiled(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled kernel the short path launches for these arguments, or None (not launched
        yet with their signature, or not launched through the short path at all)."""
        if not self.fast or self._backend is None:
            return None
        hit = self._cache.get(self._key(self._device(), args, kwargs)) if self._runtime_names.isdisjoint(kwargs) \
            else None
        return None if hit is None else hit[0]

    def _key(self, dev: int, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """The signature (module docstring)."""
        be = self._backend
        return (dev, *kwargs.items(), *[native_specialize_impl(be, a, False, True, True) for a in args])

    def _tail(self, npos: int, kwargs: dict[str, Any]) -> tuple:
        """The values of the parameters after the positional ones, in order: as passed, else defaults."""
        return tuple(kwargs[n] if n in kwargs else self._defaults[n] for n in self._names[npos:])
