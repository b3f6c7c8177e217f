#!/usr/bin/env python3
"""torch_dump.py — write a flux-dump v1 file (../shared/flux-dump.md) from a PyTorch run of
diffusers' FluxTransformer2DModel, with forward hooks, so a GPU run can be diffed against flux-sim
with `flux-oracle diff`.

    from torch_dump import FluxDumper
    with FluxDumper("run.h5", transformer) as d:              # hooks every named module
        d.write_inputs(hidden_states=latents, encoder_hidden_states=prompt_embeds,
                       pooled_projections=pooled, img_ids=img_ids, txt_ids=txt_ids,
                       guidance=guidance, sigmas=sigmas, timesteps=timesteps / 1000)
        for i, t in enumerate(timesteps):
            with d.step(i, timestep=t / 1000, sigma=sigmas[i], sigma_next=sigmas[i + 1]):
                d.record("latents_in", latents)
                v = transformer(hidden_states=latents, timestep=t / 1000, ...)[0]
                latents = scheduler.step(v, t, latents)[0]
                d.record("latents_out", latents)
        d.final(latents)

Naming (the format's rules): a dataset per module output, named by its path in
`model.named_modules()`; a tuple output stores element k as `name#k` (None elements skipped); a
module called again within one forward stores `name@1`, `name@2`, ...; each step group gets the
`order` attribute (hook firing order) and the root gets format/version/producer/dtype/config.
Hooks fire only inside `step()`, so anything run outside it (e.g. a VAE) is not recorded.

Size savers, both invisible to readers: `dedupe=True` stores bitwise-identical tensors once and
hard-links the other names (HDF5 hard links, as the reference dumps do); `compress=True` stores
datasets of >= 256 elements as one shuffle+deflate chunk.

Options: `modules=` a predicate on the module name to record a subset (then pass
`recorded_modules=` text for the attribute); `parallel=` a dict written as the `parallel`
attribute (world, mesh, rank, sharding) for per-rank or sharded runs; `dtype=` overrides the
run's dtype name. bfloat16 tensors are stored as float32 (HDF5 has no bfloat16), as the format
says. Needs torch, h5py, numpy; diffusers is not imported here.
"""
import contextlib
import hashlib
import json

import h5py
import numpy as np

FORMAT_VERSION = 1
CONFIG_KEYS = ["patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers",
               "attention_head_dim", "num_attention_heads", "joint_attention_dim",
               "pooled_projection_dim", "guidance_embeds", "axes_dims_rope"]


def _to_numpy(t):
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def _dtype_name(model):
    import torch
    for p in model.parameters():
        return {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                torch.float16: "float16"}.get(p.dtype, str(p.dtype).replace("torch.", ""))
    return "float32"


class FluxDumper:
    def __init__(self, path, model, config=None, dtype=None, producer=None, modules=None,
                 recorded_modules="all", parallel=None, dedupe=True, compress=False, extra_attrs=None):
        self.model = model
        self.modules = modules
        self.dedupe, self.compress = dedupe, compress
        self.f = h5py.File(path, "w", track_order=True)
        cfg = config if config is not None else getattr(model, "config", {})
        cfg = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
        if "axes_dims_rope" in cfg:
            cfg["axes_dims_rope"] = list(cfg["axes_dims_rope"])
        a = self.f.attrs
        a["format"] = "flux-dump"
        a["version"] = FORMAT_VERSION
        a["producer"] = producer or f"tools/torch_dump.py + {type(model).__name__} forward hooks"
        a["dtype"] = dtype or _dtype_name(model)
        a["config"] = json.dumps(cfg)
        if parallel is not None:
            a["parallel"] = json.dumps(parallel)
        for k, v in (extra_attrs or {}).items():
            a[k] = v
        self.recorded_modules = recorded_modules
        self._group = None
        self._handles = []
        self._seen = {}   # (dtype, shape, digest) -> dataset, across steps (pos_embed repeats)
        self._hook_all()

    # ---- hooks ----
    def _hook_all(self):
        import torch.nn as nn
        for name, mod in self.model.named_modules():
            if name == "":          # the root: its output equals proj_out
                continue
            if isinstance(mod, (nn.ModuleList, nn.ModuleDict)):   # containers have no forward
                continue
            if self.modules is not None and not self.modules(name):
                continue
            self._handles.append(mod.register_forward_hook(self._make_hook(name)))

    def _make_hook(self, name):
        def hook(module, inputs, output):
            if self._group is None:
                return
            k = self._calls.get(name, 0)
            self._calls[name] = k + 1
            self._store(name if k == 0 else f"{name}@{k}", output)
        return hook

    def _store(self, name, out):
        import torch
        if out is None:
            return
        if isinstance(out, torch.Tensor):
            self.record(name, out)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                self._store(f"{name}#{i}", o)
        # other outputs (dataclasses such as Transformer2DModelOutput) are the root's: skipped

    # ---- writing ----
    def _write(self, grp, name, arr):
        if self.dedupe:
            key = (arr.dtype.str, arr.shape, hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).digest())
            if key in self._seen:
                grp[name] = self._seen[key]       # hard link to the identical dataset
                return
        kw = {}
        if self.compress and arr.size >= 256:
            kw = dict(chunks=arr.shape, compression="gzip", shuffle=True)
        ds = grp.create_dataset(name, data=arr, **kw)
        if self.dedupe:
            self._seen[key] = ds

    def record(self, name, tensor):
        """Store one tensor in the current step (e.g. latents_in / latents_out)."""
        if self._group is None:
            raise RuntimeError(f"record({name!r}) outside step()")
        if name in self._order_set:
            raise ValueError(f"{name} recorded twice in {self._group.name}")
        self._write(self._group, name, _to_numpy(tensor) if not isinstance(tensor, np.ndarray) else tensor)
        self._order.append(name)
        self._order_set.add(name)

    @contextlib.contextmanager
    def step(self, index, timestep, sigma, sigma_next):
        g = self.f.create_group(f"step_{index:04d}", track_order=True)
        for k, v in (("timestep", timestep), ("sigma", sigma), ("sigma_next", sigma_next)):
            g.attrs[k] = float(v)
        g.attrs["recorded_modules"] = self.recorded_modules
        self._group, self._order, self._order_set, self._calls = g, [], set(), {}
        try:
            yield self
        finally:
            g.attrs["order"] = np.array(self._order, dtype=h5py.string_dtype())
            self._group = None

    def write_inputs(self, **tensors):
        g = self.f.require_group("inputs")
        for k, v in tensors.items():
            if v is None:
                continue
            g.create_dataset(k, data=_to_numpy(v) if not isinstance(v, np.ndarray) else np.asarray(v))

    def final(self, latents):
        g = self.f.require_group("final")
        g.create_dataset("latents", data=_to_numpy(latents) if not isinstance(latents, np.ndarray) else latents)

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.f:
            self.f.close()
            self.f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
