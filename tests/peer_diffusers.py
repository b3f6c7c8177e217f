#!/usr/bin/env python3
"""diffusers' own FLUX transformers, run as their pipelines run them and dumped with flux_dump
(tests/peer_diffusers.sh; the peer venv of tools/install-peer.sh: PyPI torch 2.15.0, diffusers 0.42.1).

    peer_diffusers.py FAMILY REFDIR OUT [--steps N] [--cp ring|ulysses | --tp] [--bug timestep-rank1]
                      [--kv] [--fp64 | --bf16] [--inputs FILE]

FAMILY flux1 | flux2: diffusers' FluxTransformer2DModel | Flux2Transformer2DModel, built from
REFDIR/config.json and loaded from REFDIR/weights.safetensors (strict), fp32, with the inputs of
REFDIR/dump_fp32.h5 (/inputs). The loop mirrors FluxPipeline / Flux2Pipeline for N steps (default
2): the pipeline's sigmas linspace(1, 1/N, N), its mu (FLUX.1 calculate_shift, FLUX.2
compute_empirical_mu), retrieve_timesteps, `timestep = t.expand(B).to(dtype) / 1000`, guidance
float32 [B], scheduler.step; FLUX.2's ids are passed as the pipeline makes them (int64 [B, S, 4]),
FLUX.1's as [S, 3]. Everything is recorded with FluxDumper into OUT (a file; with --cp a folder of
rank_<r>.h5).

--cp ring|ulysses: diffusers' own context parallelism, `transformer.enable_parallelism(config=
ContextParallelConfig(ring_degree=W | ulysses_degree=W))`, one process per rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), gloo. Three run-time patches make it run on a CPU; none changes what is
computed (docs/peers.md):
  1. enable_parallelism picks the device `rank % torch.accelerator.device_count()`: 0 on a CPU,
     ZeroDivisionError. The count is taken as 1 (the device index only).
  2. ring attention needs each step's LSE; the `native` backend refuses return_lse, so the
     `_native_flash` backend (the one that returns it) is set ...
  3. ... whose forward op calls aten::_scaled_dot_product_flash_attention, which has no CPU kernel:
     it is routed to aten::_scaled_dot_product_flash_attention_for_cpu, the same attention on the
     CPU (its LSE [B, H, S], as the CUDA kernel's).
--tp: diffusers' own tensor parallelism, `transformer.enable_parallelism(config=TensorParallelConfig(
tp_degree=W))` with the class's `_tp_plan`, one process per rank as for --cp; two run-time patches
(tp_cpu_patches) make it run on a CPU; FluxDumper maps the per-rank dumps itself.
--kv: FLUX.2 reference images through the KV cache, as Flux2KleinKVPipeline runs them (its
_set_kv_attn_processors, step 0 kv_cache_mode="extract" on cat([image_latents, latents]) and
cat([image_latent_ids, img_ids]), later steps "cached" with the returned Flux2KVCache); the
reference latents and ids from the inputs' /inputs/image_latents, image_latent_ids.
--fp64 / --bf16: the model and the loop in float64 (the float32 islands promoted as the reference's
float64 dumps do, the Euler step in float64) / bfloat16 (torch's CPU kernels). --inputs FILE: the
/inputs of FILE instead of REFDIR/dump_fp32.h5.
--bug timestep-rank1: seed 000's broadcast into a temporary: rank 1's transformer embeds timestep 0
(its time embedding module's forward wrapped at run time; diffusers is not edited).
"""
import argparse
import contextlib
import json
import os
import sys

import h5py
import numpy as np
import torch


# The pipelines' own functions, taken from the installed diffusers' source and run alone: their
# modules (pipelines/flux/pipeline_flux.py, pipelines/flux2/pipeline_flux2*.py) import transformers
# (the text encoders) at import time, which this venv does not install. What runs is diffusers'
# code of the installed version, not a copy: calculate_shift, compute_empirical_mu (FLUX.2's mu)
# and _prepare_image_ids (the reference images' ids).
def pipeline_function(module, name):
    import ast
    import diffusers.pipelines as pkg
    path = os.path.join(os.path.dirname(pkg.__file__), *module.split(".")) + ".py"
    tree = ast.parse(open(path).read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []                                     # @staticmethod
    ns = {"torch": torch, "np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
    return ns[name]


def pipeline_schedule(scheduler, S_img, N, flux2):
    """The pipelines' schedule: sigmas linspace(1, 1/N, N), their mu, retrieve_timesteps."""
    if flux2:
        mu = pipeline_function("flux2.pipeline_flux2", "compute_empirical_mu")(image_seq_len=S_img, num_steps=N)
    else:
        c = scheduler.config
        mu = pipeline_function("flux.pipeline_flux", "calculate_shift")(
            S_img, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
            c.get("base_shift", 0.5), c.get("max_shift", 1.15))
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / N, N), device="cpu", mu=mu)   # retrieve_timesteps(..., sigmas=, mu=)
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def load_reference_model(Model, refdir, dt):
    """Model (FluxTransformer2DModel or Flux2...) from REFDIR/config.json, every weight of
    REFDIR/weights.safetensors loaded strictly, in dtype dt; returns (model, config)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(refdir, "config.json")))
    model = Model.from_config(cfg).to(dt).eval()
    missing, unexpected = model.load_state_dict(load_file(os.path.join(refdir, "weights.safetensors")), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    return model, cfg


def read_inputs(path):
    """A dump's /inputs as tensors and its scheduler config; a flux-sim dump has none: FLUX.1-dev's,
    which FLUX.2 ships too (its pipelines differ only in mu)."""
    with h5py.File(path, "r") as ref:
        inp = {k: torch.from_numpy(ref["inputs"][k][...]) for k in ref["inputs"]}
        sched_cfg = (json.loads(ref.attrs["scheduler_config"]) if "scheduler_config" in ref.attrs else
                     {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5,
                      "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096})
    return inp, sched_cfg


def pipeline_inputs(inp, dt, flux2):
    """What the pipeline hands the transformer: latents and prompt embeddings in dt; FLUX.2's ids as
    Flux2Pipeline's _prepare_latent_ids / _prepare_text_ids make them (int64 [B, S, 4]), FLUX.1's
    as FluxPipeline's ([S, 3], float) with the pooled vector; guidance in float32 (float64 for a
    float64 run), None without a guidance embedder (klein, FLUX.1-schnell)."""
    x = dict(latents=inp["hidden_states"].to(dt), prompt_embeds=inp["encoder_hidden_states"].to(dt), pooled=None)
    B = x["latents"].shape[0]
    gdt = torch.float64 if dt == torch.float64 else torch.float32
    x["guidance"] = torch.full([1], float(inp["guidance"][0]), dtype=gdt).expand(B) if "guidance" in inp else None
    if flux2:
        x["img_ids"] = inp["img_ids"].round().to(torch.int64).unsqueeze(0).expand(B, -1, -1)
        x["txt_ids"] = inp["txt_ids"].round().to(torch.int64).unsqueeze(0).expand(B, -1, -1)
    else:
        x["img_ids"], x["txt_ids"] = inp["img_ids"].float(), inp["txt_ids"].float()
        x["pooled"] = inp["pooled_projections"].float()
    return x


def dumped_loop(d, model, scheduler, timesteps, x, flux2):
    """The pipeline's Euler loop, dumped: /inputs, then per step latents_in, the transformer call
    (the hooks record every module), scheduler.step, latents_out; the final latents."""
    from flux_dump import pipeline_timesteps
    latents, B = x["latents"], x["latents"].shape[0]
    d.write_inputs(hidden_states=latents, encoder_hidden_states=x["prompt_embeds"], pooled_projections=x["pooled"],
                   img_ids=x["img_ids"], txt_ids=x["txt_ids"], guidance=x["guidance"], sigmas=scheduler.sigmas,
                   timesteps=pipeline_timesteps(timesteps, latents.dtype))
    for i, t in enumerate(timesteps):
        timestep = t.expand(B).to(latents.dtype) / 1000
        with d.step(i, timestep=timestep, sigma=scheduler.sigmas[i], sigma_next=scheduler.sigmas[i + 1]):
            d.record("latents_in", latents)
            args = dict(hidden_states=latents, timestep=timestep, guidance=x["guidance"],
                        encoder_hidden_states=x["prompt_embeds"], txt_ids=x["txt_ids"], img_ids=x["img_ids"],
                        return_dict=False)
            if not flux2:
                args["pooled_projections"] = x["pooled"]
            v = model(**args)[0]
            latents = scheduler.step(v, t, latents, return_dict=False)[0]
            d.record("latents_out", latents)
    d.final(latents)


def cpu_patches():
    import diffusers.models.attention_dispatch as ad
    if torch.accelerator.device_count() == 0:                       # patch 1
        torch.accelerator.device_count = lambda: 1

    def flash_cpu(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):   # patch 3
        if enable_gqa:
            raise ValueError("`enable_gqa` is not yet supported for native flash attention.")
        q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
        out = out.transpose(1, 2).contiguous()
        lse = lse.transpose(1, 2).contiguous()
        return (out, lse) if return_lse else out

    ad._native_flash_attention_forward_op = flash_cpu


def tp_cpu_patches():
    """diffusers' own tensor parallelism (enable_parallelism(config=TensorParallelConfig(..)),
    diffusers >= 0.42) on a CPU: the device index (modeling_utils.py:1719 divides by
    torch.accelerator.device_count(), 0 here) and hooks/tensor_parallel.py:25's device list
    (_SUPPORTED_TP_DEVICES has no "cpu": apply_tensor_parallel refuses the mesh at :494). Neither
    changes what is computed: the plan's sharding and all-reduces run on gloo as they would on NCCL."""
    import diffusers.hooks.tensor_parallel as tpm
    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1
    if "cpu" not in tpm._SUPPORTED_TP_DEVICES:
        tpm._SUPPORTED_TP_DEVICES = tpm._SUPPORTED_TP_DEVICES + ("cpu",)


class PromoteFP32ToFP64:
    """--fp64: diffusers computes three things in float32 whatever the model dtype (the timestep
    sinusoid's torch.arange(dtype=float32) and .float(), the RoPE tables' and apply_rotary_emb's
    .float()); the reference's float64 dumps promote them (../shared/reference/flux2-tiny/README.md,
    "float32 islands"), and so does this, during the forward only: Tensor.float() is the identity
    on float64 tensors and torch.arange(dtype=float32) makes float64. Values otherwise unchanged."""

    def __enter__(self):
        self.arange, self.float = torch.arange, torch.Tensor.float
        arange, flt = self.arange, self.float

        def arange64(*a, **k):
            if k.get("dtype") == torch.float32:
                k["dtype"] = torch.float64
            return arange(*a, **k)

        torch.arange = arange64
        torch.Tensor.float = lambda t, *a, **k: t if t.dtype == torch.float64 else flt(t, *a, **k)
        return self

    def __exit__(self, *exc):
        torch.arange, torch.Tensor.float = self.arange, self.float


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=["flux1", "flux2"])
    ap.add_argument("refdir")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--cp", choices=["ring", "ulysses"])
    ap.add_argument("--tp", action="store_true",
                    help="diffusers' own tensor parallelism over WORLD_SIZE gloo ranks: enable_parallelism(config="
                         "TensorParallelConfig(tp_degree=W)), the class's _tp_plan (tp_cpu_patches)")
    ap.add_argument("--bug", choices=["timestep-rank1"])
    ap.add_argument("--true-cfg", action="store_true",
                    help="true CFG with the negative prompt and scale of REFDIR/dump_fp32.h5's /inputs: "
                         "FluxPipeline's true_cfg_scale (FLUX.1), Flux2KleinPipeline's guidance_scale (FLUX.2)")
    ap.add_argument("--kv", action="store_true",
                    help="FLUX.2 reference images through the KV cache, as Flux2KleinKVPipeline runs them: the "
                         "image_latents/image_latent_ids of the inputs' /inputs, the KV attention processors, step 0 "
                         "kv_cache_mode='extract' on [reference; latents], later steps 'cached'")
    ap.add_argument("--fp64", action="store_true", help="the model and the loop in float64 instead of float32")
    ap.add_argument("--bf16", action="store_true", help="the model and the latents in bfloat16 (torch's CPU kernels)")
    ap.add_argument("--inputs", help="the dump whose /inputs to run [REFDIR/dump_fp32.h5]")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler
    from flux_dump import FluxDumper, pipeline_timesteps
    f2 = a.family == "flux2"
    if f2:
        from diffusers import Flux2Transformer2DModel as Model
    else:
        from diffusers import FluxTransformer2DModel as Model

    rank, world = 0, 1
    if a.cp or a.tp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        cpu_patches() if a.cp else tp_cpu_patches()

    dt = torch.float64 if a.fp64 else torch.bfloat16 if a.bf16 else torch.float32
    model, cfg = load_reference_model(Model, a.refdir, dt)
    inp, sched_cfg = read_inputs(a.inputs or os.path.join(a.refdir, "dump_fp32.h5"))
    x = pipeline_inputs(inp, dt, f2)
    latents, prompt_embeds, pooled, guidance = x["latents"], x["prompt_embeds"], x["pooled"], x["guidance"]
    img_ids, txt_ids = x["img_ids"], x["txt_ids"]
    B, S_img = latents.shape[0], latents.shape[1]

    neg = None   # true CFG: the pipelines' second call on the negative prompt
    if a.true_cfg:
        neg = dict(encoder_hidden_states=inp["negative_encoder_hidden_states"].float(), pooled_projections=None)
        if f2:
            neg["txt_ids"] = inp["negative_txt_ids"].round().to(torch.int64).unsqueeze(0).expand(B, -1, -1)
        else:
            neg["txt_ids"] = inp["negative_txt_ids"].float()
            neg["pooled_projections"] = inp["negative_pooled_projections"].float()
        cfg_scale = float(inp["true_cfg_scale"][0])

    kv = None   # Flux2KleinKVPipeline: reference latents [B, R, C] and ids [B, R, 4] (int64)
    if a.kv:
        from diffusers.models.transformers.transformer_flux2 import (Flux2KVAttnProcessor,
                                                                     Flux2KVParallelSelfAttnProcessor)
        for block in model.transformer_blocks:            # the pipeline's _set_kv_attn_processors
            block.attn.set_processor(Flux2KVAttnProcessor())
        for block in model.single_transformer_blocks:
            block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())
        kv = dict(latents=inp["image_latents"].to(dt),
                  ids=inp["image_latent_ids"].round().to(torch.int64).unsqueeze(0).expand(B, -1, -1))
        # the ids must be the pipeline's own: Flux2KleinKVPipeline's _prepare_image_ids on latents
        # of each image's grid (read off the ids' t groups)
        ids0, grids = kv["ids"][0], []
        for t in torch.unique_consecutive(ids0[:, 0]).tolist():
            g = ids0[ids0[:, 0] == t]
            grids.append(torch.zeros(1, 1, int(g[:, 1].max()) + 1, int(g[:, 2].max()) + 1))
        want = pipeline_function("flux2.pipeline_flux2_klein_kv", "_prepare_image_ids")(grids)[0]
        if not torch.equal(want, ids0):
            sys.exit(f"peer_diffusers: /inputs/image_latent_ids are not _prepare_image_ids' for {len(grids)} image(s)")

    N = a.steps
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(sched_cfg)
    timesteps = pipeline_schedule(scheduler, S_img, N, f2)

    kw = {}
    if a.cp:
        from diffusers import ContextParallelConfig
        model.set_attention_backend("_native_flash")                 # patch 2
        cpc = ContextParallelConfig(ring_degree=world) if a.cp == "ring" else ContextParallelConfig(ulysses_degree=world)
        model.enable_parallelism(config=cpc)
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "rank_{rank}.h5")
    elif a.tp:   # FluxDumper maps it itself from the model's TensorParallelConfig and _tp_plan
        from diffusers import TensorParallelConfig
        model.enable_parallelism(config=TensorParallelConfig(tp_degree=world))
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "rank_{rank}.h5")
    else:
        path = a.out
    if a.bug == "timestep-rank1" and rank == 1:
        emb = model.time_guidance_embed if f2 else model.time_text_embed
        orig = emb.forward
        emb.forward = lambda timestep, *args, **kw2: orig(timestep * 0, *args, **kw2)

    producer = (f"diffusers {diffusers.__version__} {Model.__name__}"
                f"{f' + enable_parallelism({a.cp} {world})' if a.cp else ''}"
                f"{f' + enable_parallelism(tp {world})' if a.tp else ''} + flux_dump; torch {torch.__version__} CPU")
    with torch.no_grad(), FluxDumper(path, model, producer=producer, **kw) as d:
        extra = {}
        if neg is not None:
            extra = dict(true_cfg_scale=torch.tensor([cfg_scale], dtype=torch.float32),
                         negative_encoder_hidden_states=neg["encoder_hidden_states"],
                         negative_txt_ids=neg["txt_ids"], negative_pooled_projections=neg["pooled_projections"])
        if kv is not None:
            extra.update(image_latents=kv["latents"], image_latent_ids=kv["ids"])
        d.write_inputs(hidden_states=latents, encoder_hidden_states=prompt_embeds, pooled_projections=pooled,
                       img_ids=img_ids, txt_ids=txt_ids, guidance=guidance, sigmas=scheduler.sigmas,
                       timesteps=pipeline_timesteps(timesteps, latents.dtype), **extra)
        for i, t in enumerate(timesteps):
            timestep = t.expand(B).to(latents.dtype) / 1000
            with d.step(i, timestep=timestep, sigma=scheduler.sigmas[i], sigma_next=scheduler.sigmas[i + 1]):
                d.record("latents_in", latents)
                args = dict(hidden_states=latents, timestep=timestep, guidance=guidance,
                            encoder_hidden_states=prompt_embeds, txt_ids=txt_ids, img_ids=img_ids, return_dict=False)
                if not f2:
                    args["pooled_projections"] = pooled
                promote = PromoteFP32ToFP64() if a.fp64 else contextlib.nullcontext()
                if kv is not None and i == 0:   # step 0: [reference; latents], extract the cache
                    args.update(hidden_states=torch.cat([kv["latents"], latents], dim=1),
                                img_ids=torch.cat([kv["ids"], img_ids], dim=1), kv_cache_mode="extract",
                                num_ref_tokens=kv["latents"].shape[1])
                    with promote:
                        v, cache = model(**args)
                elif kv is not None:            # later steps: the latents alone, the cached K/V
                    with promote:
                        v = model(**args, kv_cache=cache, kv_cache_mode="cached")[0]
                else:
                    with promote:
                        v = model(**args)[0]
                if neg is not None:   # FluxPipeline / Flux2KleinPipeline: cond, then uncond, then combine
                    args.update(encoder_hidden_states=neg["encoder_hidden_states"], txt_ids=neg["txt_ids"])
                    if not f2:
                        args["pooled_projections"] = neg["pooled_projections"]
                    vn = model(**args)[0]
                    v = vn + cfg_scale * (v - vn)
                if a.fp64:   # x + (σ_next − σ)·v in float64 (scheduler.step rounds the sample to float32)
                    sg = scheduler.sigmas
                    latents = latents + (sg[i + 1].double() - sg[i].double()) * v
                else:
                    latents = scheduler.step(v, t, latents, return_dict=False)[0]
                d.record("latents_out", latents)
        d.final(latents)
    if a.cp or a.tp:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    print(f"peer_diffusers: {a.family} rank {rank}/{world}: {path} ({N} steps)")


if __name__ == "__main__":
    sys.exit(main())
