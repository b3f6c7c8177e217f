#!/usr/bin/env python3
"""torch_flux.py — an independent PyTorch FLUX.1 transformer (diffusers' FluxTransformer2DModel
forward + FluxPipeline's Euler loop) that runs float32, float64, or bfloat16 *as a GPU does*, and
writes every module's output of every step to a flux-dump v1 file with tools/torch/torch_dump.py (the
flux_dump package of python/).
Optional switches re-create real parallel bugs (and their correct emulations) inside the run, so
that flux-sim / flux-oracle can be tested on real PyTorch bf16 runs, buggy ones included.

    tools/torch/torch_flux.py --weights W.safetensors --inputs DUMP.h5 --dtype bfloat16 --out RUN.h5
                        [--steps N] [bug / emulation switches]

No diffusers is needed: the modules below are written from the diffusers source (commit
58eb52c0803e, see ../shared/flux-spec.md) and are NAMED like diffusers' named_modules(), with the
same tuple outputs, so the FluxDumper hooks give the reference dumps' dataset names and `order`.
Weights: a diffusers-named safetensors file (F32/BF16/F16/F64). Inputs, sigmas and timesteps: the
/inputs of any flux-dump (e.g. ../shared/reference/tiny/dump_fp32.h5); the config comes from its
root `config` attribute.

Numerics (--dtype): `float32` is diffusers in float32. `float64` is the reference's fp64 run:
diffusers' float32 islands (timestep sinusoid, RoPE tables and rotation, the Euler update)
promoted to float64. `bfloat16` is FluxPipeline with a bf16 transformer on a GPU, per
../shared/reference/README.md "What rounds where": bf16 weights and inputs; Linear = bf16
operands, float32 accumulation and bias, one rounding; LayerNorm, SiLU, GELU-tanh, SDPA and
RMSNorm in float32, one rounding; every other elementwise torch op rounds to bf16; sinusoid and
RoPE in float32; FlowMatchEulerDiscreteScheduler.step as torch does it. The class `Numerics`
holds every such choice in one place. All three modes reproduce the reference dumps of
../shared/reference bit for bit on torch 1.13 CPU (tests/torch_flux.sh): that needs OpenBLAS's
Haswell sgemm kernel and torch's AVX2 kernels (set below before torch loads), OpenBLAS with more
than one thread (--blas-threads) and, in bf16, the float32 accumulation order of torch 1.13's
bf16 gemm (Numerics.linear).

Switches (each one isolated: a strategy object attached to the module(s) it concerns, see
"Bug switches" below; the dump is always rank 0's view, in full shapes):
  --double-weight MODULE:ROW:COL     one weight element of one Linear doubled
  --tp-emulate T                     correct Megatron TP of every row-parallel Linear of
                                     diffusers' _tp_plan, emulated in one process
  --rowwise-bias-every-rank M:T      row-parallel bias added to every rank's partial (M: a Linear's
                                     name, a glob, or `rowwise` for every row-parallel Linear)
  --proj-out-contiguous T            single-block proj_out cut in contiguous columns (seed 000 TP-1)
  --timestep-zero-ranks T            T ranks in lockstep threads, ranks != 0 embed timestep 0
                                     (seed 000 TP-2)
  --tp-lockstep                      run --tp-emulate as T lockstep threads (checks that machinery)
  --ring-emulate R                   ring attention over R K/V chunks, LSE merge in float32
  --ring-no-lse R                    ring partials averaged instead of LSE-merged
The T/R ranks are emulated: a row-parallel Linear is computed as T partial products of column
slices (each rounded as one GEMM output), all-reduced in rank order, each addition rounded; ring
attention as R chunked attentions merged as diffusers merges them. Colwise Linears need no
emulation: a rank's output columns are exactly a single device's.
Exit status: 0 success, 2 error (one line on stderr).
"""
import argparse
import contextlib
import fnmatch
import json
import math
import os
import struct
import sys
import threading

PROG = "torch_flux.py"


class UsageError(Exception):
    pass


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


DTYPE_NAMES = ["bfloat16", "float32", "float64"]


def make_parser():
    class P(argparse.ArgumentParser):
        def error(self, message):
            die(f"{message} (see --help)")

    p = P(prog=PROG, description="Independent PyTorch FLUX.1 transformer + Euler loop (float32, float64, or "
          "bfloat16 with GPU numerics) writing a flux-dump v1; optional switches re-create parallel bugs.",
          formatter_class=argparse.RawDescriptionHelpFormatter,
          epilog="Switches that take T/R emulate T tensor-parallel (R ring) ranks inside this one process.\n"
                 "Exit status: 0 success, 2 error (one line on stderr).")
    p.add_argument("--weights", required=True, metavar="W.safetensors", help="diffusers-named weights (F32/BF16/F16/F64)")
    p.add_argument("--inputs", required=True, metavar="DUMP.h5", help="flux-dump whose config, /inputs, sigmas and timesteps are used")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_NAMES, help="numerics of the run [bfloat16]")
    p.add_argument("--out", required=True, metavar="RUN.h5", help="flux-dump to write (every module, every step)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="run only the first N steps (/inputs keep the whole schedule, /final the latents after "
                        "step N-1) [all of /inputs/timesteps]")
    p.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads [torch's default]")
    p.add_argument("--blas-threads", type=int, default=2, metavar="N",
                   help="OpenBLAS threads: with 1, OpenBLAS rounds some float32/float64 GEMMs differently from "
                        "the reference's multi-threaded run [2]")
    p.add_argument("--compress", action="store_true", help="shuffle+deflate datasets of >= 256 elements")
    p.add_argument("--linear-order", choices=["native", "sgemm"], default="native",
                   help="bf16 Linear's float32 accumulation order: torch 1.13's bf16 gemm (the reference's) "
                        "or OpenBLAS sgemm of the upcast operands [native]")
    g = p.add_argument_group("bug switches (each re-creates one real bug)")
    g.add_argument("--double-weight", metavar="MODULE:ROW:COL", help="double weight[ROW, COL] of the Linear MODULE")
    g.add_argument("--rowwise-bias-every-rank", metavar="MODULE:T",
                   help="MODULE (a Linear's name, a glob, or `rowwise` = every row-parallel Linear of the TP plan) "
                        "row-parallel over T ranks whose partials each add the bias")
    g.add_argument("--proj-out-contiguous", type=int, metavar="T",
                   help="every single-block proj_out row-parallel over T ranks with contiguous weight columns (seed 000 TP-1)")
    g.add_argument("--timestep-zero-ranks", type=int, metavar="T",
                   help="T TP ranks in lockstep; ranks != 0 embed timestep 0 (seed 000 TP-2)")
    g.add_argument("--ring-no-lse", type=int, metavar="R", help="ring attention over R chunks, partials averaged")
    g = p.add_argument_group("correct parallel emulations")
    g.add_argument("--tp-emulate", type=int, metavar="T", help="every row-parallel Linear of the TP plan over T ranks")
    g.add_argument("--tp-lockstep", action="store_true",
                   help="with --tp-emulate: run the T ranks as lockstep threads (the --timestep-zero-ranks machinery)")
    g.add_argument("--ring-emulate", type=int, metavar="R", help="ring attention over R chunks, LSE merge in float32")
    return p


# --help and usage errors answer before torch loads (importing it takes seconds)
_ARGS = make_parser().parse_args() if __name__ == "__main__" else None

# OpenBLAS picks its sgemm kernel by CPU. The reference dumps were made with the Haswell (AVX2)
# kernel (also what Zen selects); on an AVX-512 machine OpenBLAS would pick SkylakeX, whose
# float32 accumulation order differs by an ulp here and there. Fixed before torch loads OpenBLAS;
# an OPENBLAS_CORETYPE already in the environment wins.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")   # torch's own CPU kernels: the AVX2 build

try:
    import numpy as np
    import h5py
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    die(f"needs numpy, h5py and PyTorch (python3-torch): {e}")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dump import FluxDumper  # noqa: E402


def _openblas_libs():
    import ctypes
    try:
        paths = {ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln and ".so" in ln}
    except OSError:
        return []
    libs = []
    for p in sorted(paths):
        try:
            libs.append(ctypes.CDLL(p))
        except OSError:
            pass
    return libs


def openblas_cores():
    """The kernel set (openblas_get_corename) of every OpenBLAS loaded in this process."""
    import ctypes
    cores = set()
    for lib in _openblas_libs():
        try:
            f = lib.openblas_get_corename
            f.restype = ctypes.c_char_p
            cores.add(f().decode().strip())
        except AttributeError:
            pass
    return cores


def openblas_set_threads(n):
    """OpenBLAS rounds some float32/float64 GEMMs differently with one thread than with several
    (measured on 0.3.21: e.g. 64x128x128 differs, 64x128x16 not); the reference dumps were made
    with several, so this sets the thread count at run time, whatever OPENBLAS_NUM_THREADS says."""
    for lib in _openblas_libs():
        try:
            lib.openblas_set_num_threads(int(n))
        except AttributeError:
            pass

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
DTYPES = {"float32": F32, "float64": F64, "bfloat16": BF16}


# ------------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw little-endian data
# ------------------------------------------------------------------------------------------------
def read_safetensors(path):
    """name -> float32/float64 numpy array (BF16/F16 widened exactly to float32), metadata dict."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}")
    if len(raw) < 8:
        raise UsageError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise UsageError(f"{path}: not a safetensors file (header length {n} beyond the file)")
    try:
        hdr = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise UsageError(f"{path}: safetensors header is not JSON: {e}")
    data = memoryview(raw)[8 + n:]
    meta = hdr.pop("__metadata__", {}) or {}
    out = {}
    widths = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2}
    for name, info in hdr.items():
        dt, shape, (a, b) = info.get("dtype"), info.get("shape"), info.get("data_offsets", (0, -1))
        if dt not in widths:
            raise UsageError(f"{path}: tensor {name}: dtype {dt} not supported (F32, BF16, F16, F64)")
        count = int(np.prod(shape)) if shape else 1
        if b - a != count * widths[dt] or b > len(data) or a < 0:
            raise UsageError(f"{path}: tensor {name}: data_offsets [{a}, {b}) do not fit shape {shape} {dt}")
        buf = data[a:b]
        if dt == "F32":
            arr = np.frombuffer(buf, "<f4").astype(np.float32)
        elif dt == "F64":
            arr = np.frombuffer(buf, "<f8").astype(np.float64)
        elif dt == "F16":
            arr = np.frombuffer(buf, "<f2").astype(np.float32)
        else:  # BF16: the high half of a float32
            arr = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.reshape(shape)
    return out, meta


# ------------------------------------------------------------------------------------------------
# Numerics: every dtype decision of the three modes, in one place
# ------------------------------------------------------------------------------------------------
class Numerics:
    """`act` is the activation/weight dtype. `hi` is what diffusers' `.float()` gives: float32, or
    float64 in the fp64 run (the reference promotes diffusers' float32 islands). In bf16 the
    "GPU kernels" (Linear, LayerNorm, SiLU, GELU, SDPA, RMSNorm) compute in float32 and round once:
    LayerNorm, SiLU, GELU, SDPA and RMSNorm run in float32 on upcast inputs (torch 1.13's CPU bf16
    kernels for them round intermediates); Linear uses torch's bf16 gemm with oneDNN off, which
    accumulates in float32 and rounds once (see linear())."""

    def __init__(self, name):
        self.name = name
        self.act = DTYPES[name]
        self.bf16 = self.act == BF16
        self.hi = F64 if self.act == F64 else F32
        self.linear_order = "native"
        if self.bf16:   # oneDNN's bf16 matmul (AVX-512 machines) accumulates in yet another order
            torch.backends.mkldnn.enabled = False

    def up(self, x):                 # diffusers' x.float() (identity on float64 in the fp64 run)
        return x.to(self.hi)

    def _k(self, x):                 # a GPU kernel's input: bf16 -> float32, else as is
        return x.float() if self.bf16 else x

    def _out(self, y):
        return y.to(BF16) if self.bf16 else y

    def linear(self, x, w, b):
        """nn.Linear. bf16 (cuBLAS-like): bf16 operands, float32 accumulation, bias added in
        float32, one rounding. The float32 accumulation order is that of torch 1.13's CPU bf16
        addmm with oneDNN off (its fallback gemm; probes show a sequential float32 sum over K, the
        bias added in float32, one rounding), which is the order of the reference's
        dump_bf16.h5. `linear_order = "sgemm"` instead rounds OpenBLAS's float32 sgemm of the
        upcast operands (F.linear(x.float(), w.float(), b.float()).to(bf16)): the same arithmetic
        in another order, a bf16 ulp apart in ~0.1% of the outputs."""
        if not self.bf16:
            return F.linear(x, w, b)
        if self.linear_order == "sgemm":
            return F.linear(x.float(), w.float(), None if b is None else b.float()).to(BF16)
        x2 = x.reshape(-1, x.shape[-1])          # addmm on 2-D, whatever x's strides
        y = torch.mm(x2, w.t()) if b is None else torch.addmm(b, x2, w.t())
        return y.view(*x.shape[:-1], w.shape[0])

    def layer_norm(self, x, eps):    # nn.LayerNorm(elementwise_affine=False)
        return self._out(F.layer_norm(self._k(x), (x.shape[-1],), None, None, eps))

    def silu(self, x):
        return self._out(F.silu(self._k(x)))

    def gelu_tanh(self, x):
        return self._out(F.gelu(self._k(x), approximate="tanh"))

    def rms_norm(self, x, w, eps):   # torch.nn.RMSNorm shim: x*rsqrt(mean(x^2)+eps)*w, one rounding
        xf = self._k(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * self._k(w)).to(x.dtype)

    def scores(self, q, k):          # [B,H,Sq,D] x [B,H,Sk,D] -> [B,H,Sq,Sk]: (Q Kt) / sqrt(Dh)
        return torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))

    def sdpa(self, q, k, v):         # F.scaled_dot_product_attention, no mask: [B,H,S,D]
        qf, kf, vf = self._k(q), self._k(k), self._k(v)
        p = torch.softmax(self.scores(qf, kf), dim=-1)
        return self._out(torch.matmul(p, vf))

    def sdpa_lse(self, q, k, v):     # a flash kernel with return_lse: out in act dtype, lse in hi
        qf, kf, vf = self._k(q), self._k(k), self._k(v)
        s = self.scores(qf, kf)
        return self._out(torch.matmul(torch.softmax(s, dim=-1), vf)), torch.logsumexp(s, dim=-1)


# ------------------------------------------------------------------------------------------------
# Modules, named as diffusers names them (see ../shared/flux-spec.md §5 for the hook view)
# ------------------------------------------------------------------------------------------------
class Linear(nn.Module):
    """nn.Linear; `self.par` (None normally) is an emulated tensor-parallel strategy."""

    def __init__(self, N, fan_in, fan_out):
        super().__init__()
        self.N, self.in_features, self.out_features = N, fan_in, fan_out
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in, dtype=N.act), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(fan_out, dtype=N.act), requires_grad=False)
        self.par = None

    def forward(self, x):
        if self.par is not None:
            return self.par(self, x)
        return self.N.linear(x, self.weight, self.bias)


class SiLU(nn.Module):
    def __init__(self, N):
        super().__init__()
        self.N = N

    def forward(self, x):
        return self.N.silu(x)


class GELUTanh(nn.Module):           # nn.GELU(approximate="tanh") (single-block act_mlp)
    def __init__(self, N):
        super().__init__()
        self.N = N

    def forward(self, x):
        return self.N.gelu_tanh(x)


class GELU(nn.Module):               # diffusers.models.activations.GELU: proj then gelu-tanh
    def __init__(self, N, dim_in, dim_out):
        super().__init__()
        self.N = N
        self.proj = Linear(N, dim_in, dim_out)

    def forward(self, x):
        return self.N.gelu_tanh(self.proj(x))


class LayerNorm(nn.Module):          # LayerNorm(dim, elementwise_affine=False, eps=1e-6)
    def __init__(self, N, eps=1e-6):
        super().__init__()
        self.N, self.eps = N, eps

    def forward(self, x):
        return self.N.layer_norm(x, self.eps)


class RMSNorm(nn.Module):            # torch.nn.RMSNorm(dim_head, eps=1e-6), affine
    def __init__(self, N, dim, eps=1e-6):
        super().__init__()
        self.N, self.eps = N, eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=N.act), requires_grad=False)

    def forward(self, x):
        return self.N.rms_norm(x, self.weight, self.eps)


class Timesteps(nn.Module):
    """Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) = get_timestep_embedding
    (embeddings.py:27): float32 (arange float32, timesteps.float()), float64 in the fp64 run."""

    def __init__(self, N, num_channels=256):
        super().__init__()
        self.N, self.num_channels = N, num_channels

    def forward(self, timesteps):
        half = self.num_channels // 2
        exponent = -math.log(10000) * torch.arange(start=0, end=half, dtype=self.N.hi)
        exponent = exponent / (half - 0)
        emb = torch.exp(exponent)
        emb = self.N.up(timesteps[:, None]) * emb[None, :]
        emb = 1 * emb
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)      # flip_sin_to_cos


class TimestepEmbedding(nn.Module):
    def __init__(self, N, in_channels, dim):
        super().__init__()
        self.linear_1 = Linear(N, in_channels, dim)
        self.act = SiLU(N)
        self.linear_2 = Linear(N, dim, dim)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class PixArtAlphaTextProjection(nn.Module):
    def __init__(self, N, in_features, hidden):
        super().__init__()
        self.linear_1 = Linear(N, in_features, hidden)
        self.act_1 = SiLU(N)
        self.linear_2 = Linear(N, hidden, hidden)

    def forward(self, caption):
        return self.linear_2(self.act_1(self.linear_1(caption)))


class CombinedTimestepTextProjEmbeddings(nn.Module):
    """CombinedTimestep[Guidance]TextProjEmbeddings (embeddings.py:1585/1604)."""

    def __init__(self, N, dim, pooled_dim, guidance):
        super().__init__()
        self.time_proj = Timesteps(N)
        self.timestep_embedder = TimestepEmbedding(N, 256, dim)
        if guidance:
            self.guidance_embedder = TimestepEmbedding(N, 256, dim)
        self.text_embedder = PixArtAlphaTextProjection(N, pooled_dim, dim)
        self.guidance = guidance

    def forward(self, timestep, guidance, pooled_projection):
        temb = self.timestep_embedder(self.time_proj(timestep).to(dtype=pooled_projection.dtype))
        if self.guidance:
            gemb = self.guidance_embedder(self.time_proj(guidance).to(dtype=pooled_projection.dtype))
            temb = temb + gemb
        return temb + self.text_embedder(pooled_projection)


class FluxPosEmbed(nn.Module):
    """FluxPosEmbed + get_1d_rotary_pos_embed (embeddings.py:1120): angles in float64, tables
    `.float()` (float64 in the fp64 run)."""

    def __init__(self, N, axes_dim, theta=10000):
        super().__init__()
        self.N, self.axes_dim, self.theta = N, list(axes_dim), theta

    def forward(self, ids):
        pos = self.N.up(ids)
        cos_out, sin_out = [], []
        for i, dim in enumerate(self.axes_dim):
            freqs = 1.0 / (float(self.theta) ** (torch.arange(0, dim, 2, dtype=F64) / dim)) / 1.0
            freqs = torch.outer(pos[:, i].to(F64) if pos.dtype != F64 else pos[:, i], freqs)
            cos_out.append(self.N.up(freqs.cos().repeat_interleave(2, dim=1)))
            sin_out.append(self.N.up(freqs.sin().repeat_interleave(2, dim=1)))
        return torch.cat(cos_out, dim=-1), torch.cat(sin_out, dim=-1)


def apply_rotary_emb(N, x, freqs):
    """apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1) (embeddings.py:1187):
    the rotation in float32 (float64 in the fp64 run), one rounding back to x.dtype."""
    cos, sin = freqs
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (N.up(x) * cos + N.up(x_rotated) * sin).to(x.dtype)


class AdaLayerNormZero(nn.Module):
    def __init__(self, N, dim):
        super().__init__()
        self.silu = SiLU(N)
        self.linear = Linear(N, dim, 6 * dim)
        self.norm = LayerNorm(N)

    def forward(self, x, emb):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroSingle(nn.Module):
    def __init__(self, N, dim):
        super().__init__()
        self.silu = SiLU(N)
        self.linear = Linear(N, dim, 3 * dim)
        self.norm = LayerNorm(N)

    def forward(self, x, emb):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa


class AdaLayerNormContinuous(nn.Module):
    def __init__(self, N, dim):
        super().__init__()
        self.silu = SiLU(N)
        self.linear = Linear(N, dim, 2 * dim)
        self.norm = LayerNorm(N)

    def forward(self, x, conditioning_embedding):
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)                     # scale first (gotcha 8)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FluxAttention(nn.Module):
    """FluxAttention + FluxAttnProcessor (transformer_flux.py:77). `self.core` (None normally) is
    an emulated context-parallel attention (RingAttention)."""

    def __init__(self, N, dim, heads, head_dim, added_kv):
        super().__init__()
        self.N, self.head_dim, self.heads = N, head_dim, heads
        self.norm_q = RMSNorm(N, head_dim)
        self.norm_k = RMSNorm(N, head_dim)
        self.to_q = Linear(N, dim, dim)
        self.to_k = Linear(N, dim, dim)
        self.to_v = Linear(N, dim, dim)
        self.added_kv = added_kv
        if added_kv:
            self.to_out = nn.ModuleList([Linear(N, dim, dim), nn.Dropout(0.0)])
            self.norm_added_q = RMSNorm(N, head_dim)
            self.norm_added_k = RMSNorm(N, head_dim)
            self.add_q_proj = Linear(N, dim, dim)
            self.add_k_proj = Linear(N, dim, dim)
            self.add_v_proj = Linear(N, dim, dim)
            self.to_add_out = Linear(N, dim, dim)
        self.core = None

    def attention(self, q, k, v):    # attention_dispatch._native_attention: [B,S,H,D] in and out
        if self.core is not None:
            return self.core(self.N, q, k, v)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        return self.N.sdpa(q, k, v).permute(0, 2, 1, 3)

    def forward(self, hidden_states, encoder_hidden_states=None, image_rotary_emb=None):
        query = self.to_q(hidden_states).unflatten(-1, (-1, self.head_dim))
        key = self.to_k(hidden_states).unflatten(-1, (-1, self.head_dim))
        value = self.to_v(hidden_states).unflatten(-1, (-1, self.head_dim))
        if encoder_hidden_states is not None:
            eq = self.add_q_proj(encoder_hidden_states)
            ek = self.add_k_proj(encoder_hidden_states)
            ev = self.add_v_proj(encoder_hidden_states)
        query = self.norm_q(query)
        key = self.norm_k(key)
        if encoder_hidden_states is not None:
            eq = self.norm_added_q(eq.unflatten(-1, (-1, self.head_dim)))
            ek = self.norm_added_k(ek.unflatten(-1, (-1, self.head_dim)))
            ev = ev.unflatten(-1, (-1, self.head_dim))
            query = torch.cat([eq, query], dim=1)
            key = torch.cat([ek, key], dim=1)
            value = torch.cat([ev, value], dim=1)
        query = apply_rotary_emb(self.N, query, image_rotary_emb)
        key = apply_rotary_emb(self.N, key, image_rotary_emb)
        out = self.attention(query, key, value).flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return out
        s_txt = encoder_hidden_states.shape[1]
        enc, out = out.split_with_sizes([s_txt, out.shape[1] - s_txt], dim=1)
        out = self.to_out[1](self.to_out[0](out.contiguous()))
        enc = self.to_add_out(enc.contiguous())
        return out, enc


class FeedForward(nn.Module):        # FeedForward(dim, dim, activation_fn="gelu-approximate")
    def __init__(self, N, dim, mult=4):
        super().__init__()
        self.net = nn.ModuleList([GELU(N, dim, dim * mult), nn.Dropout(0.0), Linear(N, dim * mult, dim)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class FluxTransformerBlock(nn.Module):
    def __init__(self, N, dim, heads, head_dim):
        super().__init__()
        self.norm1 = AdaLayerNormZero(N, dim)
        self.norm1_context = AdaLayerNormZero(N, dim)
        self.attn = FluxAttention(N, dim, heads, head_dim, added_kv=True)
        self.norm2 = LayerNorm(N)
        self.ff = FeedForward(N, dim)
        self.norm2_context = LayerNorm(N)
        self.ff_context = FeedForward(N, dim)

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb):
        norm_hs, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_ehs, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(encoder_hidden_states, emb=temb)
        attn_output, context_attn_output = self.attn(norm_hs, norm_ehs, image_rotary_emb)

        attn_output = gate_msa.unsqueeze(1) * attn_output
        hidden_states = hidden_states + attn_output
        norm_hs = self.norm2(hidden_states)
        norm_hs = norm_hs * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        ff_output = gate_mlp.unsqueeze(1) * self.ff(norm_hs)
        hidden_states = hidden_states + ff_output

        context_attn_output = c_gate_msa.unsqueeze(1) * context_attn_output
        encoder_hidden_states = encoder_hidden_states + context_attn_output
        norm_ehs = self.norm2_context(encoder_hidden_states)
        norm_ehs = norm_ehs * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        encoder_hidden_states = encoder_hidden_states + c_gate_mlp.unsqueeze(1) * self.ff_context(norm_ehs)
        return encoder_hidden_states, hidden_states


class FluxSingleTransformerBlock(nn.Module):
    def __init__(self, N, dim, heads, head_dim, mlp_ratio=4):
        super().__init__()
        self.norm = AdaLayerNormZeroSingle(N, dim)
        self.proj_mlp = Linear(N, dim, dim * mlp_ratio)
        self.act_mlp = GELUTanh(N)
        self.proj_out = Linear(N, dim + dim * mlp_ratio, dim)
        self.proj_out.packed_blocks = [dim, dim * mlp_ratio]           # input = [attn | mlp]
        self.attn = FluxAttention(N, dim, heads, head_dim, added_kv=False)

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb):
        s_txt = encoder_hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        residual = hidden_states
        norm_hs, gate = self.norm(hidden_states, emb=temb)
        mlp_hs = self.act_mlp(self.proj_mlp(norm_hs))
        attn_output = self.attn(norm_hs, image_rotary_emb=image_rotary_emb)
        hidden_states = torch.cat([attn_output, mlp_hs], dim=2)
        gate = gate.unsqueeze(1)
        hidden_states = gate * self.proj_out(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states[:, :s_txt], hidden_states[:, s_txt:]


class FluxTransformer2DModel(nn.Module):
    def __init__(self, N, cfg):
        super().__init__()
        self.N, self.cfg = N, cfg
        H, Dh = cfg["num_attention_heads"], cfg["attention_head_dim"]
        D = H * Dh
        out_ch = cfg.get("out_channels") or cfg["in_channels"]
        self.pos_embed = FluxPosEmbed(N, cfg["axes_dims_rope"])
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(N, D, cfg["pooled_projection_dim"],
                                                                  bool(cfg.get("guidance_embeds")))
        self.context_embedder = Linear(N, cfg["joint_attention_dim"], D)
        self.x_embedder = Linear(N, cfg["in_channels"], D)
        self.transformer_blocks = nn.ModuleList(
            [FluxTransformerBlock(N, D, H, Dh) for _ in range(cfg["num_layers"])])
        self.single_transformer_blocks = nn.ModuleList(
            [FluxSingleTransformerBlock(N, D, H, Dh) for _ in range(cfg["num_single_layers"])])
        self.norm_out = AdaLayerNormContinuous(N, D)
        self.proj_out = Linear(N, D, cfg.get("patch_size", 1) ** 2 * out_ch)

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids,
                guidance=None):
        hidden_states = self.x_embedder(hidden_states)
        timestep = timestep.to(hidden_states.dtype) * 1000
        if guidance is not None:
            guidance = guidance.to(hidden_states.dtype) * 1000
        temb = self.time_text_embed(timestep, guidance, pooled_projections)
        encoder_hidden_states = self.context_embedder(encoder_hidden_states)
        image_rotary_emb = self.pos_embed(torch.cat((txt_ids, img_ids), dim=0))
        for block in self.transformer_blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb, image_rotary_emb)
        for block in self.single_transformer_blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb, image_rotary_emb)
        hidden_states = self.norm_out(hidden_states, temb)
        return (self.proj_out(hidden_states),)


def build_model(N, cfg, state):
    """The model with `state` (name -> numpy) loaded: rounded to N.act (bf16: nearest even, as
    from_pretrained(torch_dtype=torch.bfloat16)). Parameters may be shared between instances."""
    m = FluxTransformer2DModel(N, cfg).eval()
    names = {n for n, _ in m.named_parameters()}
    missing, extra = sorted(names - set(state)), sorted(set(state) - names)
    if missing or extra:
        what = (f"missing {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")) if missing \
            else f"unexpected {extra[0]}" + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else "")
        raise UsageError(f"weights do not match the config: {what}")
    for n, p in m.named_parameters():
        t = state[n]
        if tuple(t.shape) != tuple(p.shape):
            raise UsageError(f"weights: {n} has shape {list(t.shape)}, the config needs {list(p.shape)}")
        p.data = t
    return m


def load_state(path, N):
    arrays, meta = read_safetensors(path)
    # float32 -> bf16 directly (RNE); float64 values of F32 files are exact
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(N.act) for k, v in arrays.items()}, meta


# ------------------------------------------------------------------------------------------------
# Bug switches and their correct emulations. Each is a strategy object set on the module(s) it
# concerns (Linear.par, FluxAttention.core); nothing else in the model knows about them.
# ------------------------------------------------------------------------------------------------
# diffusers' FluxTransformer2DModel._tp_plan: the row-parallel Linears (the colwise ones compute,
# per rank, exactly the output columns a single device computes, so they need no emulation).
ROWWISE = ["transformer_blocks.*.attn.to_out.0", "transformer_blocks.*.attn.to_add_out",
           "transformer_blocks.*.ff.net.2", "transformer_blocks.*.ff_context.net.2",
           "single_transformer_blocks.*.proj_out"]


def is_rowwise(name):
    return any(fnmatch.fnmatchcase(name, p) for p in ROWWISE)


def tp_columns(lin, T, contiguous=False):
    """Input columns rank r holds, r = 0..T-1: by packed block (PackedRowwiseParallel; one block
    for a plain rowwise Linear) or, with `contiguous`, [r*K/T, (r+1)*K/T) of the whole width."""
    blocks = [lin.in_features] if contiguous else getattr(lin, "packed_blocks", [lin.in_features])
    for b in blocks:
        if b % T:
            raise UsageError(f"TP {T} does not divide a {b}-column block of a {lin.in_features}-wide Linear")
    cols, off = [[] for _ in range(T)], 0
    for b in blocks:
        for r in range(T):
            cols[r] += range(off + r * (b // T), off + (r + 1) * (b // T))
        off += b
    return [torch.tensor(c, dtype=torch.long) for c in cols]


def allreduce_in_rank_order(parts):
    """NCCL-like all-reduce of bf16 (act dtype) partials: each addition rounds; rank order."""
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


class RowParallel:
    """A row-parallel Linear over T ranks, emulated in one process (all ranks hold the same
    activations). Rank r: partial_r = Linear(x[..., in_cols[r]], W[:, w_cols[r]]) (one rounding),
    the partials all-reduced in rank order, then the bias once (Megatron's _Row).
    Bugs: `bias_every_rank` (each partial gets the bias inside its Linear, so the sum has T of
    them); `contiguous` (W cut in contiguous columns while the rank's input is still [attn_r|mlp_r])."""

    def __init__(self, T, bias_every_rank=False, contiguous=False):
        self.T, self.bias_every_rank, self.contiguous = T, bias_every_rank, contiguous

    def setup(self, lin):
        self.in_cols = tp_columns(lin, self.T)
        self.w_cols = tp_columns(lin, self.T, contiguous=self.contiguous)
        return self

    def __call__(self, lin, x):
        N = lin.N
        parts = [N.linear(x[..., ic], lin.weight[:, wc], lin.bias if self.bias_every_rank else None)
                 for ic, wc in zip(self.in_cols, self.w_cols)]
        out = allreduce_in_rank_order(parts)
        return out if self.bias_every_rank else out + lin.bias


class LockstepGroup:
    """T rank threads exchanging partials at each row-parallel Linear (a barrier all-reduce)."""

    def __init__(self, T):
        self.T, self.slots, self.result = T, [None] * T, None
        self.barrier = threading.Barrier(T)

    def allreduce(self, rank, partial):
        self.slots[rank] = partial
        self.barrier.wait()
        if rank == 0:
            self.result = allreduce_in_rank_order(self.slots)
        self.barrier.wait()
        out = self.result
        self.barrier.wait()            # everyone has read it before the next call overwrites it
        return out


class RowParallelRank:
    """The same Linear as RowParallel, for rank `rank` of a LockstepGroup: its partial comes from
    its own activations (which differ between ranks when their inputs do)."""

    def __init__(self, group, rank):
        self.group, self.rank = group, rank

    def setup(self, lin):
        self.cols = tp_columns(lin, self.group.T)[self.rank]
        return self

    def __call__(self, lin, x):
        part = lin.N.linear(x[..., self.cols], lin.weight[:, self.cols], None)
        return self.group.allreduce(self.rank, part) + lin.bias


class RingAttention:
    """Context-parallel (ring) attention over R ranks, emulated in one process, as diffusers'
    TemplatedRingAttention (attention_dispatch.py:2351) with convert_to_fp32=True. The sequence is
    sharded as diffusers' _cp_plan shards the model inputs: rank r holds text tokens shard r and
    image tokens shard r (contiguous, sizes differing by at most one), so its joint chunk is
    [txt_r | img_r]. Rank r's queries visit the K/V chunks r, r+1, ... (mod R): per chunk a flash
    kernel gives out (act dtype) and LSE (float32); merged in float32:
        out = prev_out - sigmoid(lse - prev_lse) * (prev_out - out)
        lse = prev_lse - logsigmoid(prev_lse - lse)
    then rounded once. Bug `average`: out <- out + (out_j - out)/(j+1), the LSEs ignored."""

    def __init__(self, R, average=False):
        self.R, self.average, self.s_txt = R, average, None

    def chunks(self, S):
        st, si = self.s_txt, S - self.s_txt
        t = torch.tensor_split(torch.arange(st), self.R)
        i = torch.tensor_split(torch.arange(st, S), self.R)
        if min(len(c) for c in i) == 0:
            raise UsageError(f"ring {self.R}: fewer than {self.R} image tokens ({si})")
        return [torch.cat([a, b]) for a, b in zip(t, i)]

    def __call__(self, N, q, k, v):           # [B,S,H,D]
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        ch = self.chunks(q.shape[2])
        out = torch.empty_like(q)
        for r in range(self.R):
            qr, acc, acc_lse = q[:, :, ch[r]], None, None
            for j in range(self.R):
                c = ch[(r + j) % self.R]
                o, lse = N.sdpa_lse(qr, k[:, :, c], v[:, :, c])
                o, lse = o.to(N.hi), lse.to(N.hi)[..., None]
                if acc is None:
                    acc, acc_lse = o, lse
                elif self.average:
                    acc = acc + (o - acc) / (j + 1)
                else:
                    acc = acc - torch.sigmoid(lse - acc_lse) * (acc - o)
                    acc_lse = acc_lse - F.logsigmoid(acc_lse - lse)
            out[:, :, ch[r]] = acc.to(q.dtype)
        return out.permute(0, 2, 1, 3)


def parse_spec(flag, text, kinds):
    parts = text.split(":")
    if len(parts) != len(kinds):
        raise UsageError(f"{flag} {text}: expected {':'.join(k[0] for k in kinds)}")
    out = []
    for p, (label, typ) in zip(parts, kinds):
        try:
            v = typ(p)
        except ValueError:
            raise UsageError(f"{flag} {text}: {label} must be {'an integer' if typ is int else 'a name'}")
        if typ is int and label in ("T", "R") and v < 1:
            raise UsageError(f"{flag} {text}: {label} must be >= 1")
        out.append(v)
    return out


def apply_switches(model, args, rank_group=None, rank=0):
    """Attach the strategies the switches ask for to `model`. Returns a description (JSON-able)."""
    mods = dict(model.named_modules())
    desc = {}
    heads = model.cfg["num_attention_heads"]

    def tp_degree(flag, T):          # TP shards whole heads (the attention of a rank is its heads)
        if heads % T:
            raise UsageError(f"{flag} {T}: TP degree must divide the {heads} attention heads")
        return T

    if args.double_weight:
        name, row, col = parse_spec("--double-weight", args.double_weight, [("MODULE", str), ("ROW", int), ("COL", int)])
        lin = mods.get(name)
        if not isinstance(lin, Linear):
            raise UsageError(f"--double-weight: {name!r} is not a Linear of this model")
        if not (0 <= row < lin.out_features and 0 <= col < lin.in_features):
            raise UsageError(f"--double-weight: ({row}, {col}) outside {name}'s weight [{lin.out_features}, {lin.in_features}]")
        if rank == 0:     # the parameter is shared by every rank's model: double it once
            with torch.no_grad():
                lin.weight[row, col] = lin.weight[row, col] * 2
        desc["double_weight"] = [name, row, col]
    linears = [(n, m) for n, m in mods.items() if isinstance(m, Linear)]
    if rank_group is not None:           # --timestep-zero-ranks / --tp-lockstep: every rowwise Linear
        tp_degree("--timestep-zero-ranks" if args.timestep_zero_ranks else "--tp-emulate", rank_group.T)
        for n, m in linears:
            if is_rowwise(n):
                m.par = RowParallelRank(rank_group, rank).setup(m)
    elif args.tp_emulate:
        tp_degree("--tp-emulate", args.tp_emulate)
        for n, m in linears:
            if is_rowwise(n):
                m.par = RowParallel(args.tp_emulate).setup(m)
        desc["tp_emulate"] = args.tp_emulate
    if args.rowwise_bias_every_rank:
        glob, T = parse_spec("--rowwise-bias-every-rank", args.rowwise_bias_every_rank, [("MODULE", str), ("T", int)])
        tp_degree("--rowwise-bias-every-rank", T)
        hit = [(n, m) for n, m in linears if (is_rowwise(n) if glob == "rowwise" else fnmatch.fnmatchcase(n, glob))]
        if not hit:
            raise UsageError(f"--rowwise-bias-every-rank: no Linear matches {glob!r}")
        for n, m in hit:
            m.par = RowParallel(T, bias_every_rank=True).setup(m)
        desc["rowwise_bias_every_rank"] = [glob, T, len(hit)]
    if args.proj_out_contiguous:
        tp_degree("--proj-out-contiguous", args.proj_out_contiguous)
        for n, m in linears:
            if fnmatch.fnmatchcase(n, "single_transformer_blocks.*.proj_out"):
                m.par = RowParallel(args.proj_out_contiguous, contiguous=True).setup(m)
        desc["proj_out_contiguous"] = args.proj_out_contiguous
    ring = args.ring_emulate or args.ring_no_lse
    if ring:
        core = RingAttention(ring, average=bool(args.ring_no_lse))
        for m in mods.values():
            if isinstance(m, FluxAttention):
                m.core = core
        model.ring = core
        desc["ring_no_lse" if args.ring_no_lse else "ring_emulate"] = ring
    return desc


# ------------------------------------------------------------------------------------------------
# Inputs and the sampling loop (FluxPipeline.__call__ steps 5-6, no CFG)
# ------------------------------------------------------------------------------------------------
def read_inputs(path):
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise UsageError(f"{path}: cannot open as HDF5: {e}")
    with f:
        if f.attrs.get("format") != "flux-dump":
            raise UsageError(f"{path}: not a flux-dump file (no format=flux-dump attribute)")
        try:
            cfg = json.loads(f.attrs["config"])
        except (KeyError, ValueError):
            raise UsageError(f"{path}: no readable `config` attribute")
        if "inputs" not in f:
            raise UsageError(f"{path}: no /inputs group")
        g = f["inputs"]
        need = ["hidden_states", "encoder_hidden_states", "pooled_projections", "img_ids", "txt_ids", "sigmas", "timesteps"]
        for k in need:
            if k not in g:
                raise UsageError(f"{path}: /inputs/{k} missing")
        inp = {k: g[k][...] for k in g}
        attrs = {k: f.attrs[k] for k in ("scheduler_config", "mu", "num_inference_steps", "weights_seed") if k in f.attrs}
        return cfg, inp, str(f.attrs.get("dtype", "float32")), attrs


def timesteps_to_pass(inp, src_dtype, mode):
    """What FluxPipeline passes as `timestep` at each step, in the mode's dtype. A dump of the same
    dtype is replayed as stored. Otherwise from the scheduler's t = float32(sigma * 1000):
    float32 t/1000; float64 float64(t)/1000 (the reference fp64 run); bfloat16 t.to(bf16)/1000
    divided in bf16 (t.expand(B).to(latents.dtype) in bf16, then timestep / 1000)."""
    n = len(inp["timesteps"])
    if src_dtype == mode:
        return [torch.tensor(float(x), dtype=DTYPES[mode]) for x in inp["timesteps"]]
    t32 = (inp["sigmas"][:n].astype(np.float32) * np.float32(1000)).astype(np.float32)
    out = []
    for t in t32:
        tt = torch.tensor(t, dtype=F32)
        out.append(tt.to(F64) / 1000 if mode == "float64" else tt.to(DTYPES[mode]) / 1000)
    return out


def check_inputs(cfg, inp, path):
    B, S_img, C = inp["hidden_states"].shape if inp["hidden_states"].ndim == 3 else (None, None, None)
    if B is None or C != cfg["in_channels"]:
        raise UsageError(f"{path}: /inputs/hidden_states shape {list(inp['hidden_states'].shape)} does not fit in_channels {cfg['in_channels']}")
    e = inp["encoder_hidden_states"]
    if e.ndim != 3 or e.shape[0] != B or e.shape[2] != cfg["joint_attention_dim"]:
        raise UsageError(f"{path}: /inputs/encoder_hidden_states shape {list(e.shape)} does not fit B={B}, joint_attention_dim {cfg['joint_attention_dim']}")
    p = inp["pooled_projections"]
    if p.shape != (B, cfg["pooled_projection_dim"]):
        raise UsageError(f"{path}: /inputs/pooled_projections shape {list(p.shape)} is not [{B}, {cfg['pooled_projection_dim']}]")
    if inp["img_ids"].shape != (S_img, 3) or inp["txt_ids"].shape != (e.shape[1], 3):
        raise UsageError(f"{path}: /inputs/img_ids or txt_ids shape does not fit the sequence lengths")
    n = len(inp["timesteps"])
    if len(inp["sigmas"]) != n + 1:
        raise UsageError(f"{path}: /inputs/sigmas has {len(inp['sigmas'])} values, timesteps {n}: need N+1 and N")
    if cfg.get("guidance_embeds") and "guidance" not in inp:
        raise UsageError(f"{path}: the config has a guidance embedder but /inputs/guidance is missing")


class Run:
    """One rank's sampling loop. `zero_timestep`: this rank embeds timestep 0 (seed 000 TP-2)."""

    def __init__(self, model, N, inp, ts, n_steps, zero_timestep=False):
        self.model, self.N, self.inp, self.ts, self.n = model, N, inp, ts, n_steps
        self.zero = zero_timestep

    def tensors(self):
        N, inp = self.N, self.inp
        # hidden states, text embeddings, pooled and ids in the activation dtype (bf16: the
        # pipeline makes them in the bf16 text encoders' dtype; float32 -> bf16 rounds once)
        act = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(F32 if a.dtype != np.float64 else F64).to(N.act)
        t = {k: act(inp[k]) for k in ("hidden_states", "encoder_hidden_states", "pooled_projections", "img_ids", "txt_ids")}
        B = t["hidden_states"].shape[0]
        gdt = F64 if N.act == F64 else F32            # torch.full([1], g, dtype=float32).expand(B)
        t["guidance"] = (torch.full([1], float(inp["guidance"].reshape(-1)[0]), dtype=gdt).expand(B)
                         if self.model.cfg.get("guidance_embeds") else None)
        sdt = F64 if N.act == F64 else F32
        t["sigmas"] = torch.from_numpy(inp["sigmas"].astype(np.float64)).to(sdt)
        return t

    def step(self, latents, v, sigma, sigma_next):
        if self.N.act == F64:    # the reference fp64 run does the Euler update itself, in float64
            return latents + (sigma_next - sigma) * v
        # FlowMatchEulerDiscreteScheduler.step: sample upcast to float32; dt a float32 0-dim
        # tensor (cast to bf16 by type promotion against a bf16 model output); back to v's dtype
        sample = latents.to(F32)
        dt = sigma_next - sigma
        return (sample + dt * v).to(v.dtype)

    def __call__(self, dumper=None):
        t = self.tensors()
        latents, B = t["hidden_states"], t["hidden_states"].shape[0]
        m = self.model
        if getattr(m, "ring", None) is not None:
            m.ring.s_txt = t["encoder_hidden_states"].shape[1]
        if dumper is not None:
            dumper.write_inputs(hidden_states=latents, encoder_hidden_states=t["encoder_hidden_states"],
                                pooled_projections=t["pooled_projections"], img_ids=t["img_ids"],
                                txt_ids=t["txt_ids"], guidance=t["guidance"], sigmas=t["sigmas"],
                                timesteps=torch.stack(self.ts))
        sig = t["sigmas"]
        for i in range(self.n):
            timestep = self.ts[i].expand(B)
            if self.zero:
                timestep = torch.zeros_like(timestep)
            ctx = dumper.step(i, timestep=float(self.ts[i]), sigma=float(sig[i]), sigma_next=float(sig[i + 1])) \
                if dumper is not None else contextlib.nullcontext()
            with ctx, torch.no_grad():
                if dumper is not None:
                    dumper.record("latents_in", latents)
                v = m(hidden_states=latents, encoder_hidden_states=t["encoder_hidden_states"],
                      pooled_projections=t["pooled_projections"], timestep=timestep, img_ids=t["img_ids"],
                      txt_ids=t["txt_ids"], guidance=t["guidance"])[0]
                latents = self.step(latents, v, sig[i], sig[i + 1])
                if dumper is not None:
                    dumper.record("latents_out", latents)
        if dumper is not None:
            dumper.final(latents)
        return latents


def run_lockstep(runs, dumper, group):
    """Rank 0 in this thread (with the dumper), ranks 1.. in threads; a failing rank breaks the
    barrier so that no rank waits forever."""
    errors = [None] * len(runs)

    def body(r):
        try:
            runs[r](dumper if r == 0 else None)
        except threading.BrokenBarrierError as e:
            errors[r] = errors[r] or e
        except BaseException as e:  # noqa: B902 - report whatever stopped a rank
            errors[r] = e
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(1, len(runs))]
    for th in threads:
        th.start()
    body(0)
    for th in threads:
        th.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if any(errors):
        raise RuntimeError("a rank left the lockstep group")


# ------------------------------------------------------------------------------------------------
def main(argv=None, args=None):
    args = args if args is not None else make_parser().parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        die(str(e))


def run(args):
    for flag in ("steps", "threads", "blas_threads", "proj_out_contiguous", "timestep_zero_ranks", "tp_emulate", "ring_emulate", "ring_no_lse"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.ring_emulate and args.ring_no_lse:
        raise UsageError("--ring-emulate and --ring-no-lse exclude each other")
    if args.tp_lockstep and not args.tp_emulate:
        raise UsageError("--tp-lockstep needs --tp-emulate T")
    lockstep = args.timestep_zero_ranks or (args.tp_emulate if args.tp_lockstep else None)
    if args.timestep_zero_ranks and (args.tp_emulate or args.rowwise_bias_every_rank or args.proj_out_contiguous):
        raise UsageError("--timestep-zero-ranks runs its own TP emulation: no other TP switch with it")
    degrees = {args.tp_emulate, args.proj_out_contiguous, args.timestep_zero_ranks} - {None}
    if args.rowwise_bias_every_rank:
        degrees.add(parse_spec("--rowwise-bias-every-rank", args.rowwise_bias_every_rank, [("MODULE", str), ("T", int)])[1])
    if len(degrees) > 1:
        raise UsageError(f"the TP switches name different degrees {sorted(degrees)}: one TP group per run")
    if args.threads:
        torch.set_num_threads(args.threads)
    openblas_set_threads(args.blas_threads)
    if not os.path.isfile(args.weights):
        raise UsageError(f"{args.weights}: no such file")
    if not os.path.isfile(args.inputs):
        raise UsageError(f"{args.inputs}: no such file")

    N = Numerics(args.dtype)
    N.linear_order = args.linear_order
    cfg, inp, src_dtype, attrs = read_inputs(args.inputs)
    check_inputs(cfg, inp, args.inputs)
    n_all = len(inp["timesteps"])
    n = args.steps or n_all
    if n > n_all:
        raise UsageError(f"--steps {n}: {args.inputs} has {n_all} timesteps")
    ts = timesteps_to_pass(inp, src_dtype, args.dtype)
    state, _ = load_state(args.weights, N)

    ranks = lockstep or 1
    group = LockstepGroup(ranks) if lockstep else None
    models = [build_model(N, cfg, state) for _ in range(ranks)]
    desc = {}
    for r, m in enumerate(models):
        d = apply_switches(m, args, rank_group=group, rank=r)
        desc = desc or d
    if args.timestep_zero_ranks:
        desc["timestep_zero_ranks"] = args.timestep_zero_ranks
    elif lockstep:
        desc["tp_emulate"], desc["tp_lockstep"] = args.tp_emulate, True

    cores = openblas_cores()
    want = os.environ.get("OPENBLAS_CORETYPE", "")
    if cores and want and {c.lower() for c in cores} != {want.lower()}:
        print(f"{PROG}: warning: OpenBLAS runs its {'/'.join(sorted(cores))} kernels, not {want} (it was loaded before "
              f"this module set OPENBLAS_CORETYPE): float32/float64 Linears may differ from the reference in the "
              f"last bits; set OPENBLAS_CORETYPE in the environment", file=sys.stderr)
    producer = (f"tools/torch/torch_flux.py (independent PyTorch FluxTransformer2DModel, torch {torch.__version__} CPU, "
                f"OpenBLAS {'/'.join(sorted(cores)) or '?'} kernels) + tools/torch/torch_dump.py forward hooks; {args.dtype}")
    if args.dtype == "bfloat16":
        producer += (": bf16 weights and inputs, Linear bf16 operands with float32 accumulation and one rounding, "
                     "layer_norm/silu/gelu/SDPA/RMSNorm in float32 rounded once, sinusoid and RoPE float32, "
                     "FlowMatchEulerDiscreteScheduler.step")
    if desc:
        producer += "; switches " + json.dumps(desc, sort_keys=True)
    extra = dict(attrs)
    extra["torch_flux_switches"] = json.dumps(desc, sort_keys=True)
    existed = os.path.lexists(args.out)
    try:
        # --steps N < the schedule: a deliberate truncation, declared (the dumper refuses a
        # subset it was not told about: a loop that stopped early must not look complete)
        declared = ",".join(str(i) for i in range(n)) if n < n_all else None
        dumper = FluxDumper(args.out, models[0], config=cfg, dtype=args.dtype, producer=producer,
                            compress=args.compress, extra_attrs=extra, recorded_steps=declared)
    except OSError as e:
        raise UsageError(f"{args.out}: cannot create: {os.strerror(e.errno) if e.errno else e}")
    try:
        with dumper:
            runs = [Run(m, N, inp, ts, n, zero_timestep=bool(args.timestep_zero_ranks) and r > 0)
                    for r, m in enumerate(models)]
            if lockstep:
                run_lockstep(runs, dumper, group)
            else:
                runs[0](dumper)
    except BaseException:
        # no half-written dump at the path: FluxDumper published this run's partial file there only
        # if nothing was there before (else it kept it at its temporary name); a dump that was
        # there before is never deleted
        if not existed and os.path.exists(args.out):
            os.unlink(args.out)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(args=_ARGS))
