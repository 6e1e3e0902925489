"""On the path (``PYTHONPATH``) with ``TRITONCOMM_TRACE_IMPORTS=DIR`` set, every Python process writes
the files of the modules it loaded to ``DIR/<pid>.txt`` when it exits (``tests.integrations.gpupack``
reads them)."""

from __future__ import annotations

import atexit
import os
import sys


def _write() -> None:
    with open(os.path.join(os.environ["TRITONCOMM_TRACE_IMPORTS"], f"{os.getpid()}.txt"), "w") as f:
        f.writelines(m.__file__ + "\n" for m in list(sys.modules.values()) if getattr(m, "__file__", None))


if os.environ.get("TRITONCOMM_TRACE_IMPORTS"):
    atexit.register(_write)
