"""Timing the way the benchmarks report it: per call, inside CUDA graphs on GPUs.

GPU (``mode="graph"``): ``calls`` calls are captured in one CUDA graph; each timed replay is preceded by an untimed
one (it absorbs the ranks' start skew, since a collective cannot finish before every rank has
joined); the per-call time is the median replay time over ``calls``. CPU world: the median
wall-clock time of synchronous calls (the interpreter runs kernels synchronously).
Callers combine ranks by taking the max of the ranks' medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["time_per_call_us"]


def time_per_call_us(fn: Callable[[], object], device: torch.device, barrier: Callable[[], None], *,
                     calls: int = 32, replays: int = 20, warmup: int = 3, mode: str = "graph",
                     after_capture: Callable[[], None] | None = None, samples_out: list[float] | None = None,
                     host_out: list[float] | None = None) -> float:
    """Median microseconds per call of ``fn`` on this rank (see module docstring). ``mode="eager"``
    times ``calls`` plain launches back to back between two events instead of a graph replay.
    ``after_capture`` (collective, graph mode) runs between the capture and the first replay: what a
    baseline needs there, e.g. vLLM's registration of the graph's buffers. ``samples_out``, if given,
    receives every sample (µs per call) in the order taken: whether a slow median was slow throughout.
    ``host_out`` (eager mode on GPUs) receives the median host time per call: the seconds the host took to
    issue the ``calls`` launches, which never wait for the GPU (fewer than the launch queue holds); a
    per-call time close to it says the host, not the GPU, set the pace."""
    if device.type == "cuda" and mode == "eager":
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples, host = [], []
        for _ in range(replays):
            torch.cuda.synchronize(device)
            barrier()
            fn()
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host.append((time.perf_counter() - t0) * 1e6 / calls)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / calls)
        if host_out is not None:
            host_out.append(statistics.median(host))
        return _median(samples, samples_out)
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        if after_capture is not None:
            after_capture()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(replays):
            torch.cuda.synchronize(device)
            barrier()
            graph.replay()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / calls)
        del graph
        return _median(samples, samples_out)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(replays):
        barrier()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _median(samples, samples_out)


def _median(samples: list[float], samples_out: list[float] | None) -> float:
    if samples_out is not None:
        samples_out.extend(samples)
    return statistics.median(samples)
