"""Stand-ins for the few ops of vLLM's compiled extension (``torch.ops._C``) that its MoE path calls,
for worlds where that extension is absent: the CPU world, and the GPU image (vLLM's code comes from
the engines' pack, without its binaries).

Each stand-in computes what vLLM's own reference code for that op computes (its ``forward_native``
formulas, its Triton fallback's FP8 groups), on CPU and CUDA tensors; an op the extension does have
is left alone. The capability probes answer "no": without the extension its CUTLASS kernels are
absent too, so vLLM picks its Triton experts, the ones these tests drive.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import torch

#: vLLM's capability probes that its modules call on import on CUDA (``w8a8_utils``, ...).
PROBES = ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8", "cutlass_group_gemm_supported",
          "cutlass_scaled_mm_supports_fp4")


def _silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def _silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(_silu_mul(x))


def _masked_moe_activation(out: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, activation: str,
                           clamp_limit: float, alpha: float, beta: float, situ_beta: float,
                           situ_linear_beta: float) -> None:
    """SiLU-and-mul on the first ``counts[e]`` rows of each expert ``e`` (rows past it keep their
    values), with no host synchronisation."""
    if activation != "silu" or clamp_limit != 0.0:
        raise NotImplementedError(f"the stand-in of masked_moe_activation has only silu, not {activation!r}")
    rows = x.shape[-2] if x.dim() == 3 else x.shape[0]
    keep = torch.arange(rows, device=x.device)[None, :] < counts.to(torch.int64)[:, None]  # [E or 1, rows]
    keep = keep if x.dim() == 3 else keep[0]
    out.copy_(torch.where(keep[..., None], _silu_mul(x), out))


def _per_token_group_fp8_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, eps: float,
                               fp8_min: float, fp8_max: float, ue8m0: bool, column_major: bool,
                               tma_aligned: bool) -> None:
    """One fp32 scale per ``group`` values of a row, ``max(amax, eps) / fp8_max`` (rounded up to a
    power of two with ``ue8m0``), as vLLM's Triton fallback; ``s`` may be a column-major view."""
    g = x.float().view(*x.shape[:-1], x.shape[-1] // group, group)
    scale = g.abs().amax(dim=-1).clamp_min(eps) / fp8_max
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q.copy_((g / scale[..., None]).clamp(fp8_min, fp8_max).view(x.shape).to(q.dtype))
    s.copy_(scale.view(s.shape))


_TENSOR_OPS = {
    "silu_and_mul": ("silu_and_mul(Tensor! out, Tensor input) -> ()", _silu_and_mul),
    "masked_moe_activation": ("masked_moe_activation(Tensor! out, Tensor input, Tensor valid_token_counts, "
                              "str activation, float clamp_limit, float alpha, float beta, float situ_beta, "
                              "float situ_linear_beta) -> ()", _masked_moe_activation),
    "per_token_group_fp8_quant": ("per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, "
                                  "int group_size, float eps, float fp8_min, float fp8_max, bool scale_ue8m0, "
                                  "bool column_major_scales, bool tma_aligned_scales) -> ()",
                                  _per_token_group_fp8_quant),
}


def _absent(name: str) -> bool:
    try:
        getattr(torch.ops._C, name)
        return False
    except (AttributeError, RuntimeError):
        return True


def _flash_attention_names() -> None:
    """On CUDA vLLM's MoE modules import its attention modules, which import names of its flash
    attention package; without that package's binaries the import fails. Where they are absent, a
    module stands in whose names raise when called (nothing on the MoE path calls them)."""
    if "vllm.vllm_flash_attn" in sys.modules or any(
            importlib.util.find_spec(f"vllm.{b}") for b in ("_vllm_fa2_C", "_vllm_fa3_C")):
        return
    stub = types.ModuleType("vllm.vllm_flash_attn")
    stub.FA2_AVAILABLE = stub.FA3_AVAILABLE = False

    def name(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def absent(*args, **kwargs):
            raise RuntimeError(f"vllm.vllm_flash_attn.{attr}: vLLM's flash attention binaries are absent here")

        return absent

    stub.__getattr__ = name
    sys.modules["vllm.vllm_flash_attn"] = stub


def define(keep: list) -> None:
    """Define every stand-in whose op is absent; the library object goes into ``keep`` (the ops
    live as long as it does). Call it before importing vLLM's MoE modules: some probe on import."""
    _flash_attention_names()
    absent = [n for n in (*_TENSOR_OPS, *PROBES) if _absent(n)]
    if not absent:
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    for name in absent:
        if name in _TENSOR_OPS:
            schema, fn = _TENSOR_OPS[name]
            lib.define(schema)
            for key in ("CPU", "CUDA"):
                lib.impl(name, fn, key)
        else:
            lib.define(f"{name}(int cuda_device_capability) -> bool")
            lib.impl(name, lambda capability: False, "CompositeExplicitAutograd")
    keep.append(lib)
