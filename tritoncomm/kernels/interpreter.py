"""The CPU world's interpreter without work that changes nothing: ``skip_repatching``,
``skip_dead_overflow_checks`` and ``fixed_np_dtypes``, all installed by ``tritoncomm.kernels`` at
import when interpreting.

**Repatching.** Triton's interpreter (``TRITON_INTERPRET=1``) runs a kernel by *patching*
``triton.language``: every builtin of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math`` is wrapped
to call its numpy builder when a launch starts, and restored when it ends. Triton 3.6 also patches on
every call of a ``@triton.jit`` helper made from inside a kernel, though the language is patched
already: the call walks every member of those modules again (``inspect.getmembers``), finds no
builtin left to wrap, and re-installs the same tensor and core hooks. Our kernels call small helpers
(the primitives) in loops, so the repeats were 40% of a MoE dispatch and combine at world 2.

* A call of a helper patches only when some language module it sees (``tl``, ``tl.core`` in its
  globals) is not patched yet; a module counts as patched while its ``load`` is not a builtin,
  which holds exactly between a launch's patch and its restore (every builtin is wrapped together).
  So a helper called inside a kernel runs on the launch's patch, and the language after a launch is
  what it was before, as in Triton's own order. Triton's function stays reachable as ``__wrapped__``.

**Overflow checks that assert nothing.** With ``sanitize_overflow`` (on by default in Triton's
options) every int32 add, sub and mul is done again in int64 and compared with the int32 range, and
the comparison goes to ``device_assert``, which emits nothing unless the options' ``debug`` is on.
The interpreter's options never turn ``debug`` on, so each of those checks computes a condition
that nothing reads: about 45% of an all-reduce's time in the CPU world. Where ``debug`` is off, the
interpreter's options get ``sanitize_overflow=False``: the same values, the same (absent) asserts.

**The numpy dtype of a Triton dtype.** The interpreter asks for it at nearly every op (a cast, a
load, a store, a splat), and Triton 3.6's ``_get_np_dtype`` builds its table of 20 numpy dtypes on
every call (about 10 µs). ``fixed_np_dtypes`` asks Triton's function once for every scalar dtype of
``triton.language`` and answers from that table (a pointer, or a block of pointers, is a uint64 as
in Triton's; a dtype the table lacks goes to Triton's, which raises as before).

All three leave every result the same bits (``tests/kernels/test_interpreter.py`` runs kernels both ways;
``docs/algorithms.md`` has the times). Where Triton's internals differ from those this was written
against, nothing is installed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import triton.language as tl

__all__ = ["fixed_np_dtypes", "numpy_problem", "skip_dead_overflow_checks", "skip_repatching",
           "skipping_repatching"]

_MARK = "_tritoncomm_installed"  # set on each function this module installs


def _language_modules(fn: Any) -> list[Any]:
    """The language modules Triton's ``_patch_lang`` would patch for ``fn``: those in its globals."""
    return [v for v in fn.__globals__.values() if v is tl or v is tl.core]


def _patched(module: Any) -> bool:
    return not tl.core.is_builtin(getattr(module, "load", None))


def skipping_repatching() -> bool:
    """True when this process's interpreter skips the repeated patch (``skip_repatching`` ran)."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton without an interpreter
        return False
    return getattr(getattr(interpreter, "_patch_lang", None), _MARK, False)


def skip_repatching() -> bool:
    """Make the interpreter's helper calls skip patching an already patched language (module
    docstring). Idempotent; returns whether it is in place."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton without an interpreter
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if original is None or scope_type is None or not hasattr(scope_type, "restore"):
        return False  # pragma: no cover - other Triton versions
    if getattr(original, _MARK, False):
        return True

    def _patch_lang(fn: Any) -> Any:
        langs = _language_modules(fn)
        if langs and all(_patched(m) for m in langs):
            return scope_type()  # nothing patched, nothing to restore
        return original(fn)

    setattr(_patch_lang, _MARK, True)
    _patch_lang.__wrapped__ = original  # type: ignore[attr-defined]
    interpreter._patch_lang = _patch_lang
    return True


def skip_dead_overflow_checks() -> bool:
    """Turn the interpreter's ``sanitize_overflow`` off where its ``debug`` is off (module
    docstring); returns whether the checks are now skipped."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton without an interpreter
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not hasattr(options, "sanitize_overflow"):
        return False  # pragma: no cover - other Triton versions, or asserts wanted
    if options.sanitize_overflow:
        builder.options = replace(options, sanitize_overflow=False)
    return True


def fixed_np_dtypes() -> bool:
    """Answer the interpreter's ``_get_np_dtype`` from a table built once from Triton's own answers
    (module docstring). Idempotent; returns whether it is in place."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton without an interpreter
        return False
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None:
        return False  # pragma: no cover - other Triton versions
    if getattr(original, _MARK, False):
        return True
    table: dict[Any, Any] = {}
    for value in vars(tl).values():
        if isinstance(value, tl.dtype) and not isinstance(value, (tl.pointer_type, tl.block_type)):
            try:
                table[value] = original(value)
            except KeyError:  # a dtype the interpreter has no numpy type for
                pass
    uint64 = original(tl.pointer_type(tl.int8))

    def _get_np_dtype(tt_dtype: Any) -> Any:
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return uint64
        found = table.get(scalar)
        return original(tt_dtype) if found is None else found

    setattr(_get_np_dtype, _MARK, True)
    _get_np_dtype.__wrapped__ = original  # type: ignore[attr-defined]
    interpreter._get_np_dtype = _get_np_dtype
    return True


def numpy_problem(triton_version: str | None = None, numpy_version: str | None = None) -> str | None:
    """Why this Triton's interpreter cannot run our kernels with this NumPy, or None. Triton 3.6's
    interpreter converts a 1-element array to a Python int with ``int()``, which NumPy 2.4 refuses
    (Triton 3.7 and later do not): the CPU world on Triton 3.6 needs ``numpy<2.4``."""
    import numpy
    import triton

    from .launcher import triton_release

    tv = triton.__version__ if triton_version is None else triton_version
    nv = numpy.__version__ if numpy_version is None else numpy_version
    if (0, 0) < triton_release(tv) <= (3, 6) and triton_release(nv) >= (2, 4):
        return (f"the CPU world runs kernels in Triton {tv}'s interpreter, which fails with NumPy {nv}: "
                "pip install 'numpy<2.4' (or use Triton 3.7 or later)")
    return None
