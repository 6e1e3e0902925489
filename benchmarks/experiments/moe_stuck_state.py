"""Where does MoE dispatch + combine stop on instances of a few tokens called full? Two ranks
sharing a GPU (``LocalWorld(2, "cuda", shared_gpus=True)``), the ``tiny`` shape, the decode launch
shape, latency combine, ``combine`` given ``expert_buffer()``. Each argument is
``max_tokens,pdl,calls,synced[,stream,build,graph,replays]``: ``calls`` calls of ``max_tokens``
tokens; with ``synced`` the host
waits for each kernel and checks that every Lamport buffer is back at rest (a value left behind, or
a sentinel where data should be, names the buffer, half and row); without, the calls run back to
back on a side stream while the host snapshots, through another stream, the channels' per-program
epochs and every Lamport buffer once a second: two equal snapshots mean the ranks are stuck, and
the snapshot says in which kernel and what is missing. ``stream`` ``d`` runs the calls on the
default stream (``s``, a side stream, by default); ``build`` ``i`` builds the kernels inside the
first calls (``s``: one synchronised call first); ``graph`` ``g`` runs them as
``time_per_call_us`` does in graph mode: 3 calls, then ``calls`` calls captured in a CUDA graph and
replayed ``replays`` times (default 2; ``e``: eagerly).

    PYTHONPATH=. python3 benchmarks/experiments/moe_stuck_state.py 1,1,64,0 1,1,64,1
"""

import contextlib
import os
import sys
import time
from dataclasses import replace

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import default_shape
from tritoncomm.config import CommConfig
from tritoncomm.kernels import LAMPORT_SENTINEL16
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity

REST = LAMPORT_SENTINEL16 - (1 << 16)  # the at-rest half as int16


def _buffers(moe: MoEAllToAll) -> dict[str, torch.Tensor]:
    names = {"precv": "packet_rows", "pw": "packet_weights", "copy": "copies", "lpart": "lamport_partials"}
    have = moe.buffers()
    return {k: have[n] for k, n in names.items() if n in have}


def _describe(moe: MoEAllToAll, snap: dict[str, torch.Tensor]) -> list[str]:
    """Per buffer: the rows (per half) holding anything but the sentinel."""
    out = []
    rowlen = {"precv": moe.hidden, "pw": moe.top_k, "copy": moe.plan.block_n + 1, "lpart": moe.hidden}
    for name, t in snap.items():
        if name.startswith("ep_"):
            vals, counts = torch.unique(t, return_counts=True)
            out.append(f"{name}: " + ", ".join(f"{int(v)}x{int(c)}" for v, c in zip(vals, counts, strict=True)))
            continue
        halves = t.reshape(1, -1) if name == "lpart" else t.reshape(t.shape[0], -1)
        for h in range(halves.shape[0]):
            flat = halves[h].contiguous()
            words = flat.view(torch.int16)
            el = words.numel() // flat.numel()  # int16 halves per element
            busy = (words != REST).nonzero().flatten()
            if busy.numel():
                rows = sorted({int(i) // el // rowlen[name] for i in busy})
                desc = f"{name}[{h}]: {busy.numel()} halves not at rest in rows {rows[:12]}"
                if name in ("copy", "pw"):
                    desc += " values " + str([flat[r * rowlen[name]:(r + 1) * rowlen[name]].tolist()
                                               for r in rows[:4]])
                out.append(desc)
    return out


def _progress(views: dict[str, torch.Tensor], side: torch.cuda.Stream, wait_s: float) -> bool:
    """Whether the epochs move within ``wait_s``."""
    with torch.cuda.stream(side):
        before = {n: views[n].to("cpu") for n in ("ep_send", "ep_comb")}
    time.sleep(wait_s)
    with torch.cuda.stream(side):
        after = {n: views[n].to("cpu") for n in ("ep_send", "ep_comb")}
    return any(not torch.equal(before[n], after[n]) for n in before)


def _nudge(moe: MoEAllToAll, views: dict[str, torch.Tensor], side: torch.cuda.Stream) -> list[str]:
    """Stuck: write the rows already there again (a fresh store of the same bits, through the copy
    engine); if that does not move the epochs, copy the receive buffer's busy half into the other
    half. Says which, if either, let the kernels go on."""
    with torch.cuda.stream(side):
        for name in ("precv", "pw", "copy"):
            t = views.get(name)
            if t is not None:
                t.copy_(t.clone())
    side.synchronize()
    if _progress(views, side, 1.5):
        return ["unstuck by writing the packet buffers again in place"]
    t = views.get("precv")
    if t is not None:
        with torch.cuda.stream(side):
            busy = [(t[h].view(torch.int16) != REST).any().item() for h in range(2)]
            if busy[0] != busy[1]:
                src = 0 if busy[0] else 1
                t[1 - src].copy_(t[src])
        side.synchronize()
        if busy[0] != busy[1] and _progress(views, side, 1.5):
            return [f"unstuck by copying precv half {src} into half {1 - src}"]
    return ["still stuck after both nudges"]


def job(ctx, m, pdl, calls, synced, default_stream, inline, graph, replays):
    hidden, experts, k = MOE_SHAPES["tiny"]
    cuda = ctx.device.type == "cuda"
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if cuda else 1
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=1 << 30, timeout_s=20))
    gen = torch.Generator(device=ctx.device).manual_seed(7919 * m + ctx.rank)
    x = torch.randn(m, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
    ids = torch.rand(m, experts, device=ctx.device, generator=gen).topk(k).indices
    w = torch.rand(m, k, device=ctx.device, generator=gen)
    sh = replace(default_shape(comm.backend, 1, sms), pdl=pdl)
    moe = MoEAllToAll(comm, max_tokens=m, hidden=hidden, num_experts=experts, top_k=k,
                      capacity=bench_capacity(ctx.world, m, experts, k), mode="latency", shape=sh)
    lines = [f"rank {ctx.rank} ids {ids.tolist()} owners {(ids // moe.local_experts).tolist()}; heap offsets "
             + ", ".join(f"{n} {comm.heap_offset(t)}" for n, t in _buffers(moe).items())]
    views = dict(_buffers(moe))
    views["ep_send"] = comm.heap.view(moe.memory.send_ch.epochs, torch.int32)
    views["ep_comb"] = comm.heap.view(moe.memory.comb_ch.epochs, torch.int32)

    done = [0]

    def step():
        i = done[0] - 1
        done[0] += 1
        _, _, h = moe.dispatch(x, ids, w)
        if synced:
            comm.synchronize()
            ctx.barrier()
            bad = _describe(moe, {n: v.cpu() for n, v in _buffers(moe).items()})
            ctx.barrier()  # no peer's next kernel before every rank has looked
            if bad:
                lines.append(f"after dispatch {i}: " + " | ".join(bad))
        moe.combine(moe.expert_buffer(), h)
        if synced:
            comm.synchronize()
            ctx.barrier()
            bad = _describe(moe, {n: v.cpu() for n, v in _buffers(moe).items()})
            ctx.barrier()
            if bad:
                lines.append(f"after combine {i}: " + " | ".join(bad))

    if cuda:
        side = torch.cuda.Stream(ctx.device)
        work = torch.cuda.current_stream(ctx.device) if default_stream else torch.cuda.Stream(ctx.device)
        on_work = lambda: torch.cuda.stream(work)  # noqa: E731
    else:
        synced, on_work = True, contextlib.nullcontext
    status = "ok"
    try:
        if not inline:  # build the kernels first
            with on_work():
                step()
            comm.synchronize()
            ctx.barrier()
        if graph:  # as time_per_call_us: 3 calls, then ``calls`` captured and replayed
            with on_work():
                for _ in range(3):
                    step()
            comm.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=work):
                for _ in range(calls):
                    step()
            ctx.barrier()
            with on_work():
                for _ in range(replays):
                    g.replay()
        else:
            with on_work():
                for _ in range(calls):
                    step()
        last, t0 = None, time.time()
        while not synced and not work.query() and time.time() - t0 < 100:
            with torch.cuda.stream(side):
                snap = {n: v.to("cpu") for n, v in views.items()}
            side.synchronize()
            if last is not None and all(torch.equal(snap[n], last[n]) for n in snap):
                lines.append(f"stuck after {time.time() - t0:.1f}s: " + " | ".join(_describe(moe, snap)))
                lines.append(f"x[:, :4] {x[:, :4].tolist()}; precv rows [:4] "
                             f"{snap['precv'][:, :, :4].tolist() if 'precv' in snap else None}")
                lines += _nudge(moe, views, side)
                break
            last = snap
            time.sleep(1.0)
        comm.synchronize()
    except Exception as e:
        status = "FAIL " + str(e)[:260]
    lines.append(status)
    try:
        moe.close()
        comm.close()
    except Exception as e:
        lines.append("close: " + str(e)[:80])
    return "\n    ".join(lines)


def main():
    for a in sys.argv[1:]:
        f = a.split(",")
        m, pdl, calls, synced = int(f[0]), f[1] == "1", int(f[2]), f[3] == "1"
        default_stream, inline = (f[4] == "d", f[5] == "i") if len(f) > 4 else (False, False)
        graph = len(f) > 6 and f[6] == "g"
        replays = int(f[7]) if len(f) > 7 else 2
        w = LocalWorld(2, os.environ.get("BACKEND", "cuda"), shared_gpus=True, setup_timeout=120)
        try:
            out = w.run(job, m, pdl, calls, synced, default_stream, inline, graph, replays, timeout=150)
            print(f"== {a}\n  " + "\n  ".join(out), flush=True)
        except Exception as e:
            print(f"== {a} RANKERROR", str(e)[-400:], flush=True)
        finally:
            w.close()


if __name__ == "__main__":
    main()
