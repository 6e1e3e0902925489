"""Compile the kernels for sm_90 without a GPU and check the instructions that matter:
system-scope acquire/release, the global timer for bounded waits, and 16-byte vector accesses."""

from __future__ import annotations

import inspect
import re
import tempfile
from collections import Counter

import pytest
import triton
import triton.language as tl

from tritoncomm.kernels import interpreting, lamport_poll, lamport_poll_checked, pow2_at_least, signal

pytestmark = pytest.mark.skipif(interpreting(), reason="PTX checks need compiled (not interpreted) kernels")


def compile_ptx(fn, sig: dict[str, str], constexprs: dict[str, int], aligned: set[str], num_warps: int = 4) -> str:
    return compile_sm90(fn, sig, constexprs, aligned, {"num_warps": num_warps}).asm["ptx"]


def compile_sm90(fn, sig: dict[str, str], constexprs: dict[str, int], aligned: set[str], options: dict):
    """The kernel compiled for sm_90 with ``options`` (``num_warps``, ``maxnreg``, ...), as launched:
    ``aligned`` arguments divisible by 16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(sig)
    for prm in fn.params:  # parameters left out take their defaults, as at a launch
        if prm.name in sig or prm.name in constexprs or prm.default is inspect.Parameter.empty:
            continue
        if prm.is_constexpr or (prm.default == 1 and not prm.do_not_specialize):  # Triton specialises a 1
            constexprs = dict(constexprs, **{prm.name: prm.default})
        else:
            sig[prm.name] = "i32"  # an int default (no parameter defaults to a tensor)
    names = [p.name for p in fn.params]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    full = {n: sig.get(n, "constexpr") for n in names if n in sig or n in constexprs}  # in the kernel's order
    src = ASTSource(fn=fn, signature=full, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def ops(ptx: str) -> Counter:
    return Counter(re.findall(r"\b((?:ld|st|atom|red|fence|mov)\.[\w.]+)", ptx))


COMMON = {"bases": "*i64", "rank": "i32", "timeout": "i64", "diag_addr": "i64"}


@pytest.fixture(scope="module")
def oneshot_ptx() -> str:
    from tritoncomm.collectives.allreduce.oneshot import oneshot_allreduce_kernel

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", **COMMON, "flags_off": "i64", "epochs_off": "i64",
           "buf_off": "i64", "slot_bytes": "i64", "active": "i32", "sig": "i64"}
    return compile_ptx(oneshot_allreduce_kernel, sig, {"WORLD": 4, "BLOCK": 4096},
                       {"x_ptr", "out_ptr", "n", "bases", "flags_off", "epochs_off", "buf_off", "slot_bytes"}, 8)


@pytest.fixture(scope="module")
def ll_ptx() -> str:
    from tritoncomm.collectives.allreduce.ll import ll_allreduce_kernel

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "nwords": "i32", **COMMON, "epochs_off": "i64",
           "buf_off": "i64", "slot_words": "i64", "active": "i32", "hdr_off": "i64", "sig": "i64"}
    return compile_ptx(ll_allreduce_kernel, sig, {"WORLD": 4, "BLOCK": 1024},
                       {"x_ptr", "out_ptr", "n", "nwords", "bases", "epochs_off", "buf_off", "slot_words", "hdr_off"})


def test_barrier_uses_system_scope_release_and_acquire(oneshot_ptx):
    o = ops(oneshot_ptx)
    assert o["st.release.sys.global.b32"] >= 1, o
    assert o["ld.acquire.sys.global.b32"] >= 1, o
    assert "%globaltimer" in oneshot_ptx
    assert "bar.sync" in oneshot_ptx  # CTA barrier before the release and after the acquire


def test_oneshot_moves_data_in_16_byte_vectors(oneshot_ptx):
    o = ops(oneshot_ptx)
    assert o["ld.global.v4.b32"] >= 1 and o["st.global.v4.b32"] >= 1, o


def test_ll_packets_are_16_byte_stores_and_volatile_polls(ll_ptx):
    o = ops(ll_ptx)
    assert o["st.global.v2.b64"] >= 1, o  # two 8-byte packets per store
    assert o["ld.volatile.global.v2.b64"] >= 1, o
    assert "%globaltimer" in ll_ptx


@pytest.mark.parametrize("world,block,dtype", [(4, 256, "bf16"), (4, 1024, "bf16"), (3, 512, "bf16"),
                                              (2, 1024, "bf16"), (4, 1024, "fp32"), (3, 512, "fp32")])
def test_ll_twoshot_moves_16_byte_packets_and_has_no_fence(world, block, dtype):
    """(fp32 at world 3-4 once failed to compile on Triton 3.6: per-peer stores under `if p != rank`.)"""
    from tritoncomm.collectives.allreduce.ll_twoshot import ll_twoshot_allreduce_kernel

    sig = {"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "n": "i32", "nwords": "i32", "shard": "i32",
           **COMMON, "epochs_off": "i64", "rs_off": "i64", "ag_off": "i64", "tok_off": "i64", "slot_words": "i64",
           "active": "i32", "hdr_off": "i64", "sig": "i64"}
    ptx = compile_ptx(ll_twoshot_allreduce_kernel, sig, {"WORLD": world, "BLOCK": block},
                      {"x_ptr", "out_ptr", "n", "nwords", "shard", "bases", "epochs_off", "rs_off", "ag_off", "tok_off",
                       "slot_words", "hdr_off"})
    o = ops(ptx)
    assert o["st.global.v2.b64"] >= 2, o  # reduce-scatter and all-gather packets, two per store
    assert o["ld.volatile.global.v2.b64"] >= 2, o  # both receive sides poll 16 bytes at a time
    assert o["ld.global.v4.b32"] >= 1 and o["st.global.v4.b32"] >= 1, o  # input tile in, gathered tile out
    # no barrier: no release store, acquire load or fence (the one release is the timeout record's exchange)
    assert not [k for k in o if k.startswith(("st.release", "ld.acquire", "fence"))], o
    assert "%globaltimer" in ptx  # the polls are bounded


def test_barrier_flags_stored_and_polled_by_the_first_warp(oneshot_ptx):
    """The one-shot all-reduce (8 warps, barriers only) stores and polls its barrier flags from each
    program's first warp alone: every system-scope release store and acquire load sits in a block
    that predicates it on ``%tid.x < 32`` (``kernels/barrier.py``)."""
    lines = [ln for ln in oneshot_ptx.splitlines() if re.search(r"\b(st\.release|ld\.acquire)\.sys", ln)]
    assert len(lines) >= 2, lines
    for ln in lines:
        assert "%tid.x" in ln and "setp.lt.u32 p, t, 32" in ln and re.search(r"@p (st\.release|ld\.acquire)", ln), ln


@triton.jit
def _first_warp_signal_kernel(p, N: tl.constexpr):
    signal(p + tl.arange(0, N), 1, True)


def test_first_warp_signal_refuses_blocks_past_a_warp():
    """``signal(..., FIRST_WARP=True)`` takes blocks of at most 32 lanes (the first warp must hold
    every lane): 32 compile, 64 fail at compile time."""
    from triton.compiler.errors import CompilationError

    assert "st.release.sys" in compile_ptx(_first_warp_signal_kernel, {"p": "*i32"}, {"N": 32}, {"p"}, 8)
    with pytest.raises(CompilationError):
        compile_ptx(_first_warp_signal_kernel, {"p": "*i32"}, {"N": 64}, {"p"}, 8)


def test_user_primitives_compile_with_their_ordering():
    from tests.kernels.test_primitives import _counter_kernel, _handshake_kernel, _put_get_kernel

    hs = compile_ptx(_handshake_kernel, {"out_bad": "*i32", "rounds": "i32", "n": "i32", "bases": "*i64",
                                         "rank": "i32", "world": "i32", "timeout": "i64", "diag_addr": "i64",
                                         "flags_off": "i64", "epochs_off": "i64", "buf_off": "i64"},
                     {"BLOCK": 512}, {"bases", "flags_off", "epochs_off", "buf_off"})
    o = ops(hs)
    assert o["st.release.sys.global.b32"] >= 1 and o["ld.acquire.sys.global.b32"] >= 1, o
    assert o["st.relaxed.sys.global.b32"] >= 1, o  # signal_relaxed
    assert "fence.acq_rel.sys" in hs
    cnt = compile_ptx(_counter_kernel, {"out": "*i32", "bases": "*i64", "rank": "i32", "world": "i32",
                                        "timeout": "i64", "diag_addr": "i64", "flags_off": "i64",
                                        "epochs_off": "i64"}, {}, {"bases", "flags_off", "epochs_off"})
    assert re.search(r"(atom|red)\.global\.(sys\.release|release\.sys)\.add", cnt), ops(cnt)  # signal_add (3.9: red)
    pg = compile_ptx(_put_get_kernel, {"src": "*fp32", "out_put": "*fp32", "out_get": "*fp32", "n": "i32",
                                       "bases": "*i64", "rank": "i32", "world": "i32", "timeout": "i64",
                                       "diag_addr": "i64", "flags_off": "i64", "epochs_off": "i64",
                                       "buf_off": "i64", "half_bytes": "i64"}, {"BLOCK": 512},
                     {"src", "out_put", "out_get", "n", "bases", "flags_off", "epochs_off", "buf_off", "half_bytes"})
    o = ops(pg)
    assert o["ld.global.v4.b32"] >= 2 and o["st.global.v4.b32"] >= 2, o  # put and get vectorise


def test_twoshot_and_push_collectives_compile_vectorised():
    from tritoncomm.collectives.allgather.push import allgather_kernel
    from tritoncomm.collectives.allgather.reducescatter import reducescatter_kernel
    from tritoncomm.collectives.allreduce.twoshot import twoshot_allreduce_kernel

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "shard": "i32", **COMMON, "flags_off": "i64",
           "epochs_off": "i64", "rs_off": "i64", "ag_off": "i64", "active": "i32", "out_off": "i64", "out_tab": "i64",
           "sig": "i64"}
    aligned2 = {"x_ptr", "out_ptr", "n", "shard", "bases", "flags_off", "epochs_off", "rs_off", "ag_off", "out_off",
                "out_tab"}
    # staged; zero-copy with the output in the heap; zero-copy through a registered row
    for heap, reg in ((False, False), (True, False), (False, True)):
        o = ops(compile_ptx(twoshot_allreduce_kernel, sig, {"WORLD": 4, "BLOCK": 4096, "OUT_HEAP": heap,
                                                            "OUT_REG": reg}, aligned2, 8))
        assert o["ld.global.v4.b32"] >= 3 and o["st.global.v4.b32"] >= 3, o
        assert o["st.global.b16"] == 0, o
        assert o["st.release.sys.global.b32"] >= 2 and o["ld.acquire.sys.global.b32"] >= 2, o  # two barriers
    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "m": "i32", **COMMON, "flags_off": "i64", "epochs_off": "i64",
           "buf_off": "i64", "half_bytes": "i64", "stride": "i64", "active": "i32"}
    aligned = {"x_ptr", "out_ptr", "m", "bases", "flags_off", "epochs_off", "buf_off", "half_bytes", "stride"}
    for kernel in (allgather_kernel, reducescatter_kernel):
        ksig = dict(sig, out_tab="i64") if kernel is allgather_kernel else sig
        o = ops(compile_ptx(kernel, ksig, {"WORLD": 4, "BLOCK": 4096}, aligned, 8))
        assert o["ld.global.v4.b32"] >= 2 and o["st.global.v4.b32"] >= 2, (kernel, o)
    # the direct all-gather (a registered output): 16-byte stores through the row, two barriers
    o = ops(compile_ptx(allgather_kernel, dict(sig, out_tab="i64"), {"WORLD": 4, "BLOCK": 4096, "DIRECT": True},
                        aligned | {"out_tab"}, 8))
    assert o["ld.global.v4.b32"] >= 1 and o["st.global.v4.b32"] >= 2 and o["st.global.b16"] == 0, o
    assert o["st.release.sys.global.b32"] >= 2 and o["ld.acquire.sys.global.b32"] >= 2, o


def test_shards_of_different_sizes_compile_vectorised():
    """``VAR`` (``all_gatherv`` / ``reduce_scatterv``): each shard's offset and count come from the
    packed rows times ``row``; with rows of 7168 bf16 elements (``MDIV`` 16) every access stays 16
    bytes wide."""
    from tritoncomm.collectives.allgather.push import allgather_kernel
    from tritoncomm.collectives.allgather.reducescatter import reducescatter_kernel

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "m": "i32", **COMMON, "flags_off": "i64", "epochs_off": "i64",
           "buf_off": "i64", "half_bytes": "i64", "stride": "i64", "active": "i32"}
    rows = {"rows_lo": "i64", "rows_hi": "i64", "row": "i32"}
    aligned = {"x_ptr", "out_ptr", "m", "bases", "flags_off", "epochs_off", "buf_off", "half_bytes", "stride", "row"}
    for kernel in (allgather_kernel, reducescatter_kernel):
        ksig = dict(sig, out_tab="i64", **rows) if kernel is allgather_kernel else dict(sig, **rows)
        o = ops(compile_ptx(kernel, ksig, {"WORLD": 4, "BLOCK": 4096, "MDIV": 16, "VAR": True}, aligned, 8))
        assert o["ld.global.v4.b32"] >= 2 and o["st.global.v4.b32"] >= 2 and o["st.global.b16"] == 0, (kernel, o)


def test_sizes_that_are_multiples_of_8_but_not_16_stay_vectorised():
    """Triton specialises integers on divisibility by 16 only: a shard of 375000 bf16 elements (a
    3 MB all-gather at TP4) once compiled to 2-byte accesses everywhere (0.36x NCCL). With the size's
    power-of-two divisor passed as a constexpr the accesses are 16 bytes wide again."""
    from tritoncomm.collectives.allgather.push import allgather_kernel
    from tritoncomm.collectives.allgather.reducescatter import reducescatter_kernel
    from tritoncomm.collectives.allreduce.twoshot import twoshot_allreduce_kernel
    from tritoncomm.kernels import pow2_divisor

    assert [pow2_divisor(v) for v in (375000, 12500, 7, 0, 48, 1 << 20)] == [8, 4, 1, 16, 16, 16]
    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "m": "i32", **COMMON, "flags_off": "i64", "epochs_off": "i64",
           "buf_off": "i64", "half_bytes": "i64", "stride": "i64", "active": "i32"}
    aligned = {"x_ptr", "out_ptr", "bases", "flags_off", "epochs_off", "buf_off", "half_bytes", "stride"}  # not m
    for kernel in (allgather_kernel, reducescatter_kernel):
        ksig = dict(sig, out_tab="i64") if kernel is allgather_kernel else sig
        scalar = ops(compile_ptx(kernel, ksig, {"WORLD": 4, "BLOCK": 4096, "MDIV": 1}, aligned, 8))
        assert scalar["st.global.b16"] > 0 and scalar["st.global.v4.b32"] == 0, scalar  # the bug, reproduced
        o = ops(compile_ptx(kernel, ksig, {"WORLD": 4, "BLOCK": 4096, "MDIV": pow2_divisor(375000)}, aligned, 8))
        assert o["ld.global.v4.b32"] >= 2 and o["st.global.v4.b32"] >= 2 and o["st.global.b16"] == 0, (kernel, o)
    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "shard": "i32", **COMMON, "flags_off": "i64",
           "epochs_off": "i64", "rs_off": "i64", "ag_off": "i64", "active": "i32", "out_off": "i64", "out_tab": "i64",
           "sig": "i64"}
    aligned2 = {"x_ptr", "out_ptr", "shard", "bases", "flags_off", "epochs_off", "rs_off", "ag_off", "out_off",
                "out_tab"}  # not n
    o = ops(compile_ptx(twoshot_allreduce_kernel, sig, {"WORLD": 4, "BLOCK": 4096, "NDIV": 8}, aligned2, 8))
    assert o["ld.global.v4.b32"] >= 3 and o["st.global.v4.b32"] >= 3 and o["st.global.b16"] == 0, o


def test_microbenchmark_kernels_compile():
    from tritoncomm.tools.microbench import _ll_exchange_kernel, _pingpong_kernel, _put_kernel

    o = ops(compile_ptx(_put_kernel, {"src": "*u8", "bases": "*i64", "peer": "i32", "dst_off": "i64", "n": "i64"},
                        {"BLOCK": 8192}, {"src", "bases", "dst_off", "n"}, 4))
    assert o["ld.global.v4.b32"] >= 1 and o["st.global.v4.b32"] >= 1, o
    compile_ptx(_pingpong_kernel, {"bases": "*i64", "rank": "i32", "flags_off": "i64", "epochs_off": "i64",
                                   "rounds": "i32", "timeout": "i64", "diag_addr": "i64"}, {}, {"bases"})
    compile_ptx(_ll_exchange_kernel, {"out_bad": "*i32", "bases": "*i64", "rank": "i32", "epochs_off": "i64",
                                      "buf_off": "i64", "slot_words": "i64", "nwords": "i32", "timeout": "i64",
                                      "diag_addr": "i64"}, {"BLOCK": 1024}, {"bases", "epochs_off", "buf_off"})


FUSED_SIG = {"x_ptr": "*bf16", "res_ptr": "*bf16", "res_out_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
             "scale_ptr": "*fp32", "T": "i32", "H": "i32", "CW": "i32", "eps": "fp32", **COMMON}
FUSED_ALIGNED = {"x_ptr", "res_ptr", "res_out_ptr", "w_ptr", "out_ptr", "H", "CW", "bases"}


@pytest.mark.parametrize("fp8", [False, True])
def test_fused_oneshot_compiles_with_row_chunk_exchange(fp8):
    from tritoncomm.collectives.fused_norm.oneshot import allreduce_add_rmsnorm_kernel

    sig = dict(FUSED_SIG, out_ptr="*fp8e4nv" if fp8 else "*bf16", flags_off="i64", epochs_off="i64", buf_off="i64",
               slot_bytes="i64", xch_off="i64", sig="i64")
    o = ops(compile_ptx(allreduce_add_rmsnorm_kernel, sig, {"WORLD": 4, "CH": 4, "BLOCK_C": 2048, "GEMMA": False,
                                                            "FP8": fp8},
                        FUSED_ALIGNED | {"flags_off", "epochs_off", "buf_off", "slot_bytes", "xch_off"}, 4))
    # the cross-rank barrier: release stores, acquire loads; the row-chunk exchange: LL8 packets
    assert o["st.release.sys.global.b32"] >= 1 and o["ld.acquire.sys.global.b32"] >= 1, o
    assert any(k.startswith("ld.volatile") for k in o), o
    assert o["ld.global.v4.b32"] >= 1 or o["ld.global.nc.v4.b32"] >= 1, o


@pytest.mark.parametrize("world,nq,block_c,fp8", [(4, 4, 512, False), (2, 8, 512, False), (4, 1, 2048, False),
                                                  (3, 2, 1024, True)])
def test_fused_ll_twoshot_compiles_with_16_byte_packets_and_no_fence(world, nq, block_c, fp8):
    from tritoncomm.collectives.fused_norm.ll_twoshot import ll_twoshot_allreduce_add_rmsnorm_kernel

    sig = dict(FUSED_SIG, out_ptr="*fp8e4nv" if fp8 else "*bf16", epochs_off="i64", rs_off="i64", ag_off="i64",
               tok_off="i64", slot_words="i64", xch_off="i64", row_words="i32", cww="i32", hdr_off="i64", sig="i64")
    ptx = compile_ptx(ll_twoshot_allreduce_add_rmsnorm_kernel, sig,
                      {"WORLD": world, "NQ": nq, "BLOCK_C": block_c, "GEMMA": False, "FP8": fp8},
                      FUSED_ALIGNED | {"epochs_off", "rs_off", "ag_off", "tok_off", "slot_words", "xch_off",
                                       "row_words", "cww"}, 8 if block_c * pow2_at_least(world) >= 4096 else 4)
    o = ops(ptx)
    assert o["st.global.v2.b64"] >= 2 and o["ld.volatile.global.v2.b64"] >= 2, o  # both LL trips, 16 bytes
    assert o["ld.global.v4.b32"] >= 1 and o["st.global.v4.b32"] >= 1, o
    assert not any(k.startswith(("st.release", "ld.acquire", "fence")) for k in o), o
    assert "%globaltimer" in ptx


def test_fused_ll_and_twoshot_compile():
    from tritoncomm.collectives.fused_norm.ll import ll_allreduce_add_rmsnorm_kernel
    from tritoncomm.collectives.fused_norm.twoshot import twoshot_allreduce_add_rmsnorm_kernel

    sig = dict(FUSED_SIG, epochs_off="i64", buf_off="i64", slot_words="i64", xch_off="i64", row_words="i32",
               cww="i32", hdr_off="i64", sig="i64")
    ptx = compile_ptx(ll_allreduce_add_rmsnorm_kernel, sig, {"WORLD": 4, "CH": 16, "BLOCK_C": 512, "GEMMA": False,
                                                             "FP8": False},
                      FUSED_ALIGNED | {"epochs_off", "buf_off", "xch_off", "slot_words", "row_words", "cww"}, 4)
    o = ops(ptx)
    # the row's packets move two per 16-byte store and poll (8-byte ones before row_words came from the host)
    assert o["st.global.v2.b64"] >= 1 and o["ld.volatile.global.v2.b64"] >= 1, o
    assert any(k.startswith("ld.volatile") for k in o), o  # LL polls, for the peers' data and the partials
    # no release store, acquire load or fence (only the timeout record's claim, off the fast path): a
    # release here would wait for this program's NVLink pushes to be acknowledged
    assert not any(k.startswith(("st.release", "ld.acquire", "fence")) for k in o), o
    assert "membar" not in ptx
    sig = dict(FUSED_SIG, flags_off="i64", epochs_off="i64", rs_off="i64", ag_off="i64", rstd_off="i64",
               slot_bytes="i64", rstd_slot="i64", xch_off="i64", sig="i64")
    o = ops(compile_ptx(twoshot_allreduce_add_rmsnorm_kernel, sig, {"WORLD": 4, "CH": 1, "BLOCK_C": 2048,
                                                                    "GEMMA": False, "FP8": False},
                        FUSED_ALIGNED | {"flags_off", "epochs_off", "rs_off", "ag_off", "rstd_off", "slot_bytes",
                                         "rstd_slot", "xch_off"}, 8))
    assert o["st.release.sys.global.b32"] >= 2 and o["ld.acquire.sys.global.b32"] >= 2, o
    assert o["st.global.v4.b32"] >= 1, o


@pytest.mark.parametrize("out_reg", [False, True])
def test_gemm_overlap_uses_tma_wgmma_and_system_scope_flags(out_reg):
    from tritoncomm.collectives.gemm.twoshot import gemm_twoshot_kernel

    sig = {"a_desc": "tensordesc<bf16[128,64]>", "w_desc": "tensordesc<bf16[256,64]>", "out_ptr": "*bf16",
           "out_tab": "i64", "M": "i32", "N": "i32", "K": "i32", **COMMON, "epochs_off": "i64", "pflags_off": "i64",
           "fflags_off": "i64", "recv_off": "i64", "fin_off": "i64", "hdr_off": "i64"}
    constexprs = {"WORLD": 4, "BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8, "RB": 16, "OUT_REG": out_reg}
    aligned = {"out_ptr", "N", "K", "bases", "epochs_off", "pflags_off", "fflags_off", "recv_off", "fin_off",
               "hdr_off"}
    ptx = compile_ptx(gemm_twoshot_kernel, {**sig, "sig": "i64"}, constexprs, aligned, 8)
    plain = ops(compile_ptx(gemm_twoshot_kernel, sig, {**constexprs, "sig": None}, aligned, 8))
    o = ops(ptx)
    assert "cp.async.bulk.tensor.2d" in ptx  # operands through TMA
    assert "wgmma.mma_async" in ptx  # Hopper tensor cores
    for c in (o, plain):
        # partial and final tiles published with system-scope releases, awaited with acquires
        assert c["st.release.sys.global.b32"] >= 2 and c["ld.acquire.sys.global.b32"] >= 2, c
        # 16-byte stores of partial tiles, reduced tiles and (registered) peers' outputs, 16-byte loads of partials
        assert c["st.global.v4.b32"] >= 4 and c["ld.global.v4.b32"] >= 1, c
    # the call check: the header's signature words (8 bytes) stored and compared, its flag released and
    # awaited; none of it without the check
    assert o["st.global.b64"] > plain["st.global.b64"] and o["ld.global.b64"] > plain["ld.global.b64"], (o, plain)
    assert o["st.release.sys.global.b32"] > plain["st.release.sys.global.b32"], (o, plain)
    assert o["ld.acquire.sys.global.b32"] > plain["ld.acquire.sys.global.b32"], (o, plain)


def _imports_an_engine(module: str) -> bool:
    """Whether a module imports vLLM or SGLang at the top (tests/integrations runs those with the
    engines). Read from the source: importing it here would load whatever engine a test left in
    ``sys.modules`` against this environment's packages."""
    import importlib.util
    import re

    source = open(importlib.util.find_spec(module).origin).read()
    return re.search(r"^(import|from) (vllm|sglang)\b", source, re.MULTILINE) is not None


def _entry_kernels():
    """Every kernel the package (and the example) launches: JIT functions named ``*_kernel`` by our
    convention, and the debug-mode signature check."""
    import importlib.util
    import pathlib

    from triton.runtime.jit import JITFunction

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "custom_collective.py"
    spec = importlib.util.spec_from_file_location("custom_collective_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    found = {k: f for k, f in _every_jit_function().items() if k.endswith("_kernel") or k.endswith(".check_signatures")}
    for name, obj in vars(example).items():
        if isinstance(obj, JITFunction) and name.endswith("_kernel"):
            found[f"{obj.fn.__module__}.{name}"] = obj
    return found


def _every_jit_function():
    """Every ``@triton.jit`` function of the package, helpers included, by qualified name (every
    module but those that import an engine: they hold no kernels)."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import tritoncomm

    found = {}
    for m in pkgutil.walk_packages(tritoncomm.__path__, "tritoncomm."):
        if m.name.endswith("__main__") or (not m.ispkg and _imports_an_engine(m.name)):
            continue
        for name, obj in vars(importlib.import_module(m.name)).items():
            if isinstance(obj, JITFunction):
                found[f"{obj.fn.__module__}.{name}"] = obj
    return found


def test_every_kernel_compiles_the_same_on_every_rank():
    """Triton specialises an int argument equal to 1 as a constant (and one divisible by 16 as
    aligned): without ``do_not_specialize`` rank 1 runs a different compilation from rank 0, and a
    block reduction (the fused norm's sum of squares) may then group terms differently, giving
    different bits on different ranks (seen on H200, fused LL norm, world 2)."""
    kernels = {k: f for k, f in _entry_kernels().items() if any(p.name == "rank" for p in f.params)}
    assert len(kernels) >= 13, sorted(kernels)  # all-reduce x4, fused x3, AG, RS, GEMM, check, example, ...
    for name, f in kernels.items():
        assert next(p for p in f.params if p.name == "rank").do_not_specialize, name


def test_rank_zero_and_one_get_the_same_specialisation():
    """End to end through Triton's own argument binder (what a launch uses to pick a compilation)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from tritoncomm.collectives.fused_norm.ll import ll_allreduce_add_rmsnorm_kernel as k

    binder = create_function_from_signature(k.signature, k.params, make_backend(GPUTarget("cuda", 90, 32)))
    t = torch.zeros(64, dtype=torch.bfloat16)

    def spec(rank: int):
        return binder(t, t, t, t, t, t, 3, 8192, 512, 1e-6, t, rank, 10**9, 4096, 0, 4096, 4096, 8192, 4096, 256,
                      65536, 1 << 62, WORLD=2, CH=16, BLOCK_C=512, GEMMA=False, FP8=False)[1]

    assert spec(0) == spec(1) == spec(2) == spec(3)


def _moe_ptx(kernel: str) -> str:
    return _moe_build(kernel, {"num_warps": 4}, {}).asm["ptx"]


def _moe_build(kernel: str, options: dict, overrides: dict[str, int]):
    """A MoE kernel compiled for sm_90 with ``options``, its constexprs changed by ``overrides``."""
    from tritoncomm.collectives.moe import combine, dispatch, gather, onekernel, route

    i64 = dict.fromkeys(("epochs_off", "recv_off", "recv_half", "sc_off", "sc_half"), "i64")
    if kernel in ("send", "send-held", "send-packets", "send-traced", "send-direct", "send-interleaved"):
        sig = {"x_ptr": "*bf16", "x_stride": "i32", "ids_ptr": "*i64", "ids_s0": "i32", "ids_s1": "i32",
               "w_ptr": "*fp32", "w_s0": "i32", "w_s1": "i32", "wts_ptr": "*fp32", "bad_ptr": "*i64",
               "out_ptr": "*bf16", "sc_out_ptr": "*bf16", "slot_ptr": "*i32", "owner_ptr": "*i32", "row_ptr": "*i32",
               "counts_ptr": "*i32", "bad_host_addr": "i64", "n_tokens": "i32", "hidden": "i32", "max_tokens": "i32",
               "num_experts": "i32", "capacity": "i32",
               **COMMON, "flags_off": "i64", **i64, **dict.fromkeys(("ids_off", "ids_half", "wtab_off", "wtab_half",
                                                                    "ntab_off", "ntab_half", "hist_off",
                                                                    "hist_half"), "i64"), "hist_blocks": "i32",
               "header_ptr": "*i32", "pw_off": "i64", "pw_half": "i64", "out_off": "i64", "sc_out_off": "i64",
               "trace_ptr": "*i64", "sig": "i64"}
        fn, cx = dispatch.moe_send_kernel, {"WORLD": 2, "LOCAL": 128, "TOP_K": 8, "BLOCK_K": 8, "BLOCK_H": 1024,
                                            "BLOCK_E": 64, "BLOCK_X": 256, "BLOCK_B": 16, "SUPER": 16, "FP8": False,
                                            "ROUTED": kernel != "send-held",
                                            "BLOCK_N": 1024 if kernel == "send-held" else 1, "BLOCK_W": 2,
                                            "PACKETS": kernel == "send-packets", "TRACE": kernel == "send-traced",
                                            "DIRECT": kernel == "send-direct",
                                            "INTERLEAVE": kernel == "send-interleaved"}
    elif kernel in ("route", "route-traced"):
        sig = {"ids_ptr": "*i64", "ids_s0": "i32", "ids_s1": "i32", "bad_ptr": "*i64", "n_tokens": "i32",
               "max_tokens": "i32", "num_experts": "i32", **COMMON,
               **dict.fromkeys(("flags_off", "epochs_off", "send_epochs_off", "ids_off", "ids_half", "ntab_off",
                                "ntab_half", "hist_off", "hist_half"), "i64"),
               "hist_blocks": "i32", "trace_ptr": "*i64", "sig": "i64"}
        fn, cx = route.moe_route_kernel, {"WORLD": 2, "TOP_K": 8, "BLOCK_E": 64, "BLOCK_X": 256, "SUPER": 16,
                                          "TRACE": kernel == "route-traced"}
    elif kernel == "gather":
        sig = {"out_ptr": "*bf16", "sc_out_ptr": "*bf16", "slot_ptr": "*i32", "counts_ptr": "*i32", "bad_ptr": "*i64",
               "bad_host_addr": "i64", "hidden": "i32", "max_tokens": "i32", "capacity": "i32", "hist_blocks": "i32",
               "bases": "*i64", "rank": "i32", **i64,
               **dict.fromkeys(("ids_off", "ids_half", "ntab_off", "ntab_half"), "i64"),
               **dict.fromkeys(("hist_off", "hist_half"), "i64"), "header_ptr": "*i32"}
        fn, cx = gather.moe_gather_kernel, {"WORLD": 2, "LOCAL": 128, "TOP_K": 8, "BLOCK_K": 8, "BLOCK_H": 1024,
                                            "FP8": False, "BLOCK_E": 64, "BLOCK_X": 256, "BLOCK_B": 16, "SUPER": 16,
                                            "BLOCK_W": 2}
    elif kernel in ("one", "one-packets", "one-packets-traced"):
        sig = {"out_ptr": "*bf16", "sc_out_ptr": "*bf16", "x_ptr": "*bf16", "x_stride": "i32", "ids_ptr": "*i64",
               "ids_s0": "i32", "ids_s1": "i32", "w_ptr": "*fp32", "w_s0": "i32", "w_s1": "i32", "wts_ptr": "*fp32",
               "slot_ptr": "*i32", "owner_ptr": "*i32", "row_ptr": "*i32", "counts_ptr": "*i32", "bad_ptr": "*i64",
               "bad_host_addr": "i64", "n_tokens": "i32", "bound": "i32", "hidden": "i32", "max_tokens": "i32",
               "num_experts": "i32", "capacity": "i32", **COMMON, "flags_off": "i64", **i64, "epoch_slots": "i32",
               "peer_rows": "i32",
               **dict.fromkeys(("ids_off", "ids_half", "wtab_off", "wtab_half", "pw_off", "pw_half", "copy_off",
                                "copy_half"), "i64"), "readers_ptr": "*i32",
               "header_ptr": "*i32", "trace_ptr": "*i64", "hdr_off": "i64", "hdr_half": "i64", "sig": "i64"}
        fn, cx = onekernel.moe_dispatch_one_kernel, {"WORLD": 2, "LOCAL": 128, "TOP_K": 8, "BLOCK_K": 8,
                                                     "BLOCK_H": 1024, "BLOCK_N": 1024, "BLOCK_X": 256, "FP8": False,
                                                     "PACKETS": kernel != "one", "SHARED": kernel != "one",
                                                     "BLOCK_W": 2, "TRACE": kernel == "one-packets-traced",
                                                     "LOOKAHEAD": True, "ROWS16": True}  # hidden 7168
    else:
        sig = {"out_ptr": "*bf16", "w_ptr": "*fp32", "owner_ptr": "*i32", "row_ptr": "*i32", "slot_ptr": "*i32",
               "n_tokens": "i32", "hidden": "i32", "max_tokens": "i32", "throughput_from": "i32",
               "lamport_rows": "i32", **COMMON,
               **dict.fromkeys(("flags_off", "epochs_off"), "i64"), "epoch_slots": "i32", "header_ptr": "*i32",
               **dict.fromkeys(("ybuf_off", "ids_off", "ids_half", "wtab_off", "wtab_half", "part_off", "lpart_off"),
                               "i64"),
               "trace_ptr": "*i64"}
        fn, cx = combine.moe_combine_kernel, {"WORLD": 2, "LOCAL": 128, "TOP_K": 8, "BLOCK_K": 8, "BLOCK_W": 2,
                                              "BLOCK_H": 1024, "TRACE": False,
                                              "BLOCK_HT": 4096 if kernel in ("combine-wide", "combine-chunked") else 0,
                                              "INTERLEAVE": kernel == "combine-interleaved",
                                              "CHUNKS": 4 if kernel == "combine-chunked" else 0}
    # as launched: tensors and hidden (7168) divisible by 16; the counts and rank are not
    sized = ("hidden", "capacity", "max_tokens", "num_experts", "x_stride")
    aligned = {k for k, v in sig.items() if v.startswith("*") or k in sized or k.endswith(("_off", "_half"))}
    if "sig" in overrides:  # None: compiled without the call check
        sig = {k: v for k, v in sig.items() if k != "sig"}
    return compile_sm90(fn, sig, {**cx, **overrides}, aligned, options)


@pytest.mark.parametrize("kernel", ["one-packets", "one"])
def test_the_moe_dispatch_call_check_keeps_the_data_path(kernel):
    """With the call check the one-kernel dispatch keeps its 16-byte row stores and (with packets) adds
    only its header words: one 8-byte store per peer, volatile 8-byte looks, no fence, release or acquire;
    with the barrier, the signature words beside the barrier's flag. Without it (``sig`` None) none."""
    checked = ops(_moe_build(kernel, {"num_warps": 4}, {}).asm["ptx"])
    plain = ops(_moe_build(kernel, {"num_warps": 4}, {"sig": None}).asm["ptx"])
    for o in (checked, plain):
        assert o["st.global.v4.b32"] >= 1, o
    assert checked["st.global.b64"] + checked["st.global.v2.b64"] > plain["st.global.b64"] + plain[
        "st.global.v2.b64"], (checked, plain)
    fences = ("fence", "st.release", "ld.acquire", "atom.release", "atom.acquire")
    if kernel == "one-packets":
        assert checked["ld.volatile.global.b64"] > plain["ld.volatile.global.b64"], (checked, plain)
        assert sum(v for k, v in checked.items() if k.startswith(fences)) == \
            sum(v for k, v in plain.items() if k.startswith(fences)), (checked, plain)


def test_moe_kernels_move_tokens_in_16_byte_vectors():
    """The send kernel's stores into peers' receive buffers, the gather's copies, the one-kernel
    dispatch's both, and the combine's loads of expert rows and stores (its output and pushed
    partials) are 16-byte vector accesses, with no 2-byte ones (cache hints or none), also where the
    send kernel stores rows into the peers' expert slots (``send-direct``), and where the throughput
    combine steps more columns than the latency one (``combine-wide``)."""
    for kernel in ("send", "send-held", "send-packets", "send-direct", "gather", "combine", "combine-wide",
                   "combine-interleaved", "combine-chunked", "one", "one-packets"):
        ptx = _moe_ptx(kernel)
        for op in ("st", "ld"):
            accesses = re.findall(rf"\b{op}\.global(?:\.[\w:]+)*?\.(v4\.b32|b16)\b", ptx)
            assert "v4.b32" in accesses and "b16" not in accesses, (kernel, op, sorted(set(accesses)))


def test_moe_prefill_combine_fits_its_register_cap():
    """The prefill shape's combine, as launched (its warps, its columns per step in each mode, the
    register cap that keeps two programs per SM resident: ``collectives/moe/shape.py``,
    ``register_cap``), has a stack frame (where spills go) of at most 8 bytes per thread. With 4096
    columns in the latency mode as well it spilled 148 bytes into a 112-byte frame, and the
    throughput mode's 4096 columns then gained a quarter of what they gain with 2048 in the latency
    mode (``docs/moe.md``). The throughput mode deals 4096-column items and sums them 2048 columns
    at a time: a 4096-column step spilled 16-40 bytes on Triton 3.8 and 3.9. The chunked build
    (``MoEShape.combine_chunks``, its own part summed in registers beside the partials) is held to
    the same bound."""
    import os
    import subprocess

    from tritoncomm.collectives.moe import SHAPES, register_cap

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("no cuobjdump in this triton")
    sh = SHAPES["cuda-prefill"]
    cap = register_cap(sh, sh.programs // 2)  # two programs per SM (the prefill shape's grid)
    for chunks in (0, 4):  # also without its barrier (``MoEShape.combine_chunks``)
        built = _moe_build("combine", {"num_warps": sh.num_warps, "maxnreg": cap, "enable_fp_fusion": False},
                           {"BLOCK_H": sh.block_h, "BLOCK_HT": sh.throughput_block_h, "CHUNKS": chunks})
        cubin = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False)
        try:
            cubin.write(built.asm["cubin"])
            cubin.close()
            usage = subprocess.run([tool, "-res-usage", cubin.name], capture_output=True, text=True,
                                   check=True).stdout
        finally:
            os.unlink(cubin.name)
        regs, stack = (int(re.search(rf"\b{what}:(\d+)", usage).group(1)) for what in ("REG", "STACK"))
        assert regs <= cap and stack <= 8, (chunks, usage)


def test_moe_kernels_stream_what_they_touch_once():
    """Cache hints (``collectives/moe/gather.py``): the rows laid out into the expert slots are
    streaming 16-byte stores, and the tokens, the received rows and the expert outputs are loaded
    evict-first."""
    for kernel in ("send", "send-direct", "send-interleaved", "gather", "one", "one-packets", "combine",
                   "combine-wide", "combine-chunked"):
        ptx = _moe_ptx(kernel)
        o = ops(ptx)
        if not kernel.startswith("combine"):
            assert o["st.global.cs.v4.b32"] >= 1, (kernel, o)
        if kernel != "one-packets":  # its peers' rows are Lamport polls, volatile
            assert re.search(r"ld\.global\.L1::evict_first[\w:.]*\.v4\.b32", ptx), kernel


def test_moe_kernels_wait_for_the_previous_kernel_before_memory():
    """Launched with PDL, every MoE kernel waits (``griddepcontrol.wait``) before its first load or
    store, and lets the next one start."""
    for kernel in ("route", "send", "send-held", "send-direct", "send-interleaved", "gather", "combine",
                   "combine-interleaved", "one", "one-packets"):
        ptx = _moe_ptx(kernel)
        body = ptx[ptx.index("griddepcontrol.wait"):] if "griddepcontrol.wait" in ptx else ""
        assert body and "griddepcontrol.launch_dependents" in body, kernel
        head = ptx[:len(ptx) - len(body)]
        assert not re.search(r"\b(ld|st|atom|red)\.global", head), (kernel, "memory access before the wait")


def test_moe_dispatch_with_packets_has_no_fence_and_polls_in_16_byte_vectors():
    """The one-kernel dispatch with packets has no fence and no release store or acquire load (the
    data is its own flag: no barrier flag), only the timeout record's exchanges; it polls the rows
    in 16-byte volatile loads. The barrier variant has the barrier's system-scope release."""
    packets, barrier = _moe_ptx("one-packets"), _moe_ptx("one")
    assert not re.search(r"\b(fence|membar)\.|\b(ld|st)\.[\w.]*(release|acquire)", packets)
    assert {m for m in re.findall(r"\b\w+\.[\w.]*release[\w.]*", packets)} <= {"atom.global.sys.release.exch.b64"}
    assert re.search(r"ld\.volatile\.global\.v4\.b32", packets)
    assert re.search(r"\.release\.sys|fence\.(acq_rel|sc)\.sys|membar\.sys", barrier)


def test_stage_stamps_are_compiled_only_into_traced_builds():
    """``TRACE`` adds the stamps' SM-cycle reads (``kernels.stamp``); the build launched by default
    has none."""
    for kernel, stages in (("one-packets", 6), ("send", 4), ("route", 3)):
        traced, plain = _moe_ptx(f"{kernel}-traced"), _moe_ptx(kernel)
        assert traced.count("%clock64") >= stages and "%clock64" not in plain, kernel


def test_a_timeout_record_needs_no_barrier_and_a_reset_one():
    """A poll of a block smaller than the program's threads runs warp by warp: its timeout record
    has no CTA barrier (any one thread claims and fills it), and ``lamport_reset`` adds exactly one,
    which ``SYNC=False`` leaves out."""
    from .lagging import lagging_reader_kernel

    sig = {"buf": "*fp32", "out": "*fp32", "rank": "i32", "timeout": "i64", "diag_addr": "i64", "prompt": "i32",
           "lag_ns": "i32", "write_at_ns": "i32"}
    counts = {sync: compile_ptx(lagging_reader_kernel, sig, {"SYNC": sync, "BLOCK": 4}, {"buf", "out"}).count(
        "bar.sync") for sync in (True, False)}
    assert counts == {True: 1, False: 0}, counts



@triton.jit
def _poll_kernel(buf, out, rank, timeout, diag_addr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    v = lamport_poll(buf + offs, offs < BLOCK, 1, 0, rank, timeout, diag)
    tl.store(out + offs, v)


def test_a_poll_reloads_only_a_block_copied_across_threads():
    """``lamport_poll`` of a block with at least one element per thread returns the values of the look
    that counted nothing missing; a smaller block (each element copied in several threads) makes one
    more look after the count: exactly one volatile load more."""
    sig = {"buf": "*fp32", "out": "*fp32", "rank": "i32", "timeout": "i64", "diag_addr": "i64"}
    looks = {b: len(re.findall(r"\bld\.volatile\.global", compile_ptx(_poll_kernel, sig, {"BLOCK": b}, {"buf", "out"})))
             for b in (4, 128, 512)}
    assert looks[4] == looks[128] + 1 and looks[128] == looks[512], looks


@triton.jit
def _checked_poll_kernel(buf, hdr, out, heads, sig, rank, timeout, diag_addr, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.arange(0, ROWS)[:, None]
    offs = rows * COLS + tl.arange(0, COLS)[None, :]
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    v, h = lamport_poll_checked(buf + offs, offs >= 0, hdr + rows, rows >= 0, sig, rows, 0, rank, timeout, diag)
    tl.store(out + offs, v)
    tl.store(heads + rows, h)


def _looks_after_the_last_barrier(ptx: str) -> Counter:
    """The volatile loads between the kernel's last ``bar.sync`` and the first store after it."""
    tail = ptx[ptx.rindex("bar.sync"):]
    tail = tail[:tail.index("st.global")]
    return Counter(re.findall(r"ld\.volatile\.global(?:\.v\d)?\.(b\d+)", tail))


def test_a_checked_poll_reloads_only_a_block_copied_across_threads():
    """``lamport_poll_checked`` likewise: a ``[2, 32]`` block on 4 warps (the one-kernel MoE dispatch's
    routing copies at decode: fewer elements than threads, each held by two of them) takes one more
    look at the data (32-bit here) and at the headers (16-bit here, apart from the diag word's loads)
    after a CTA barrier that follows the count; a ``[2, 256]`` block takes none. Without it a thread
    whose copy was not counted used a sentinel as data (wrong counts and rows on GPUs)."""
    sig = {"buf": "*i32", "hdr": "*i16", "out": "*i32", "heads": "*i16", "sig": "i64", "rank": "i32",
           "timeout": "i64", "diag_addr": "i64"}
    looks = {c: _looks_after_the_last_barrier(compile_ptx(_checked_poll_kernel, sig, {"ROWS": 2, "COLS": c},
                                                          {"buf", "out"}, 4))
             for c in (32, 256)}
    assert looks[32]["b32"] >= 1 and looks[32]["b16"] >= 1 and not looks[256], looks


def _sglang_patches(monkeypatch) -> None:
    """What SGLang 0.5.23's ``sglang.srt.utils.common`` does at import: ``triton.next_power_of_2``
    becomes a plain Python function (and engines' code does the like with ``triton.cdiv``)."""
    import triton

    def next_power_of_2(n: int):
        return 1 << (n - 1).bit_length() if n > 0 else 1

    def cdiv(a: int, b: int) -> int:
        return -(a // -b)

    monkeypatch.setattr(triton, "next_power_of_2", next_power_of_2)
    monkeypatch.setattr(triton, "cdiv", cdiv)


def test_no_kernel_refers_to_what_engines_patch_on_triton(monkeypatch):
    """Triton refuses a plain Python function referenced from a kernel ("Unsupported function
    referenced"), and engines replace attributes of the ``triton`` module with such functions (seen:
    every all-reduce under SGLang on two H200s). So no JIT function may reach them: every one of the
    package's hashes (which walks its body) must go through with the engines' patches in place."""
    from triton.runtime.jit import JITFunction

    _sglang_patches(monkeypatch)
    fns = _every_jit_function()
    assert len(fns) >= 60, len(fns)
    for name, f in fns.items():
        fresh = JITFunction(f.fn)  # a fresh hash: the module's own object may have cached one already
        try:
            assert fresh.cache_key  # walks the body: raises on a plain function it refers to
        except RuntimeError as e:
            pytest.fail(f"{name}: {e}")


def test_the_lamport_allreduce_compiles_under_an_engines_patches(monkeypatch):
    from triton.runtime.jit import JITFunction

    from tritoncomm.collectives.allreduce.lamport import lamport_oneshot_kernel

    _sglang_patches(monkeypatch)
    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", **COMMON, "epochs_off": "i64", "buf_off": "i64",
           "slot_bytes": "i64", "active": "i32", "hdr_off": "i64", "sig": "i64"}
    ptx = compile_ptx(JITFunction(lamport_oneshot_kernel.fn), sig, {"WORLD": 2, "BLOCK": 2048},
                      {"x_ptr", "out_ptr", "n", "bases", "epochs_off", "buf_off", "slot_bytes"})
    assert "ld.volatile.global.v4" in ptx or "ld.volatile.global.v2" in ptx, "the poll should stay vectorised"


LAMPORT_KERNELS = {
    "oneshot": ({"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", **COMMON, "epochs_off": "i64", "buf_off": "i64",
                 "slot_bytes": "i64", "active": "i32", "hdr_off": "i64"},
                {"x_ptr", "out_ptr", "n", "bases", "epochs_off", "buf_off", "slot_bytes", "hdr_off"}),
    "twoshot": ({"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "shard": "i32", **COMMON, "epochs_off": "i64",
                 "rs_off": "i64", "ag_off": "i64", "tok_off": "i64", "slot_bytes": "i64", "active": "i32",
                 "hdr_off": "i64"},
                {"x_ptr", "out_ptr", "n", "shard", "bases", "epochs_off", "rs_off", "ag_off", "tok_off", "slot_bytes",
                 "hdr_off"}),
}


@pytest.mark.parametrize("kind", list(LAMPORT_KERNELS))
@pytest.mark.parametrize("block,warps", [(256, 1), (2048, 4)])
def test_the_lamport_call_check_keeps_the_data_path(kind, block, warps):
    """With the call check (``sig`` an int64) the Lamport all-reduces keep 16-byte data stores and
    polls, store their header as one 8-byte word per peer and poll it with volatile loads, and add no
    fence or release on the data path; without it (``sig`` None) no header is stored or loaded."""
    from tritoncomm.collectives.allreduce import lamport, lamport_twoshot

    kernel = {"oneshot": lamport.lamport_oneshot_kernel, "twoshot": lamport_twoshot.lamport_twoshot_kernel}[kind]
    sig, aligned = LAMPORT_KERNELS[kind]
    checked = ops(compile_ptx(kernel, {**sig, "sig": "i64"}, {"WORLD": 2, "BLOCK": block}, aligned, warps))
    plain = ops(compile_ptx(kernel, sig, {"WORLD": 2, "BLOCK": block, "sig": None}, aligned, warps))
    for o in (checked, plain):
        assert o["st.global.v4.b32"] >= 1 and o["ld.volatile.global.v4.b32"] >= 1, o
        assert not [k for k in o if k.startswith(("fence", "st.release", "ld.acquire"))], o
    assert checked["st.global.b64"] > plain["st.global.b64"], (checked, plain)  # the header words (and resets)
    assert checked["ld.volatile.global.b64"] > plain["ld.volatile.global.b64"], (checked, plain)


def test_the_kernel_walk_skips_exactly_the_engine_modules():
    """The walk above leaves out the modules that import an engine, and only those."""
    import pkgutil

    import tritoncomm

    skipped = {m.name for m in pkgutil.walk_packages(tritoncomm.__path__, "tritoncomm.")
               if not m.ispkg and _imports_an_engine(m.name)}
    assert skipped == {"tritoncomm.integrations.vllm_fusion", "tritoncomm.integrations.vllm_moe"}
