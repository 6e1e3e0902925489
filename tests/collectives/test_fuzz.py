"""Property-based tests (hypothesis) of the host-side logic that decides sizes and validity."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tritoncomm as tc
from tritoncomm.channels import HeapAllocator
from tritoncomm.collectives import ALGORITHMS, Choice, SelectionTable
from tritoncomm.collectives.base import CollectiveBase
from tritoncomm.collectives.validation import SUPPORTED_DTYPES, check_reduce_args

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=60))
def test_heap_allocator_never_overlaps_and_coalesces(ops):
    a = HeapAllocator(64 * 1024)
    live = []
    for is_alloc, n in ops:
        if is_alloc or not live:
            try:
                live.append(a.alloc(n))
            except tc.InvalidInputError:  # refused only when no hole is large enough
                assert max((size for _, size in a._free), default=0) < -(-n // 256) * 256
        else:
            a.free(live.pop(n % len(live)))
        spans = sorted((r.offset, r.offset + -(-r.nbytes // 256) * 256) for r in a.live)
        assert all(s % 256 == 0 and e <= a.capacity for s, e in spans)
        assert all(e0 <= s1 for (_, e0), (s1, _) in itertools.pairwise(spans))
    for r in list(live):
        a.free(r)
    assert a.used_bytes == 0 and a.alloc(a.capacity).offset == 0  # fully coalesced


DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32, torch.int8, torch.uint8]


@FAST
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
       transpose=st.booleans(), op=st.sampled_from(["sum", "max", "avg", ""]), max_bytes=st.integers(0, 20000),
       out_kind=st.sampled_from(["none", "same", "fresh", "wrong_shape", "wrong_dtype", "overlap"]))
def test_validation_raises_exactly_on_bad_input(dtype, shape, transpose, op, max_bytes, out_kind):
    x = torch.zeros(shape, dtype=dtype)
    if transpose and x.dim() >= 2:
        x = x.transpose(0, 1)
    out = {"none": None, "same": x, "fresh": torch.empty_like(x, memory_format=torch.contiguous_format),
           "wrong_shape": torch.empty(x.numel() + 1, dtype=dtype),
           "wrong_dtype": torch.empty(x.shape, dtype=torch.float64), "overlap": None}[out_kind]
    if out_kind == "overlap" and x.numel():  # out starts one element into x
        big = torch.zeros(2 * x.numel() + 2, dtype=dtype)
        x, out = big[: x.numel()].view(x.shape), big[1: x.numel() + 1].view(x.shape)
    bad = (dtype not in SUPPORTED_DTYPES or op != "sum" or not x.is_contiguous()
           or x.numel() * x.element_size() > max_bytes)
    if out is not None and not bad:
        bad = (out.numel() != x.numel() or out.dtype != x.dtype or out.shape != x.shape or not out.is_contiguous()
               or (out.data_ptr() != x.data_ptr() and out.numel() > 0 and abs(out.data_ptr() - x.data_ptr())
                   < x.numel() * x.element_size()))
    try:
        check_reduce_args(x, out, op, torch.device("cpu"), max_bytes, "fuzz")
        raised = False
    except tc.InvalidInputError:
        raised = True
    assert raised == bad


choices = st.builds(Choice, algo=st.sampled_from(list(ALGORITHMS)),
                    programs=st.integers(1, 128), block=st.sampled_from([256, 1024, 4096]),
                    num_warps=st.sampled_from([1, 4, 8]))


@FAST
@given(rows=st.lists(st.tuples(st.integers(1, 1 << 30), choices), min_size=1, max_size=6),
       sizes=st.lists(st.integers(0, 1 << 31), min_size=1, max_size=20), world=st.integers(1, 8))
def test_table_lookup_is_first_covering_row_and_survives_json(rows, sizes, world):
    rows = sorted(rows, key=lambda r: r[0])
    table = SelectionTable({("allreduce", world, d): rows for d in ("bf16", "fp16", "fp32")}, "fuzz")
    again = SelectionTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.digest() == table.digest()
    for n in sizes:
        want = next((c for b, c in rows if n <= b), rows[-1][1])
        assert table.lookup("allreduce", world, "bf16", n) == want == again.lookup("allreduce", world, "fp32", n)


@FAST
@given(rows=st.lists(st.tuples(st.integers(1, 1 << 28), choices), min_size=1, max_size=6),
       max_bytes=st.integers(1, 1 << 29))
def test_capacities_cover_every_size_the_table_routes(rows, max_bytes):
    rows = sorted(rows, key=lambda r: r[0])
    stub = object.__new__(CollectiveBase)
    stub.op, stub.world = "allreduce", 2
    stub.table = SelectionTable({("allreduce", 2, d): rows for d in ("bf16", "fp16", "fp32")})
    stub.comm = type("C", (), {"backend": "cuda"})()
    stub._defaults = []  # the family's rows: unused, the table has rows for every dtype
    caps = stub._capacities(max_bytes, None)
    for n in {1, max_bytes, *(b for b, _ in rows if b <= max_bytes), *(b + 1 for b, _ in rows if b < max_bytes)}:
        algo = stub.table.lookup("allreduce", 2, "bf16", n).algo
        assert caps.get(algo, 0) >= n, (n, algo, caps)


@FAST
@given(backend=st.sampled_from(["auto", "cuda", "cpu", "gpu", ""]), heap=st.one_of(st.none(), st.integers(-5, 1 << 31)),
       timeout=st.one_of(st.floats(-1, 100), st.just(float("nan"))))
def test_config_validation(backend, heap, timeout):
    bad = backend not in ("auto", "cuda", "cpu") or (heap is not None and heap < 1 << 20) or not timeout >= 0
    if bad:
        with pytest.raises(ValueError):
            tc.CommConfig(backend=backend, heap_bytes=heap, timeout_s=timeout)
    else:
        cfg = tc.CommConfig(backend=backend, heap_bytes=heap, timeout_s=timeout)
        assert cfg.timeout_units("cuda") == cfg.timeout_units("cpu") == (0 if timeout == 0 else
                                                                         max(1, int(timeout * 1e9)))
