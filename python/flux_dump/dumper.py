#!/usr/bin/env python3
"""flux_dump.dumper — write a flux-dump v1 file (flux-sim's ../shared/flux-dump.md) from a PyTorch run
of diffusers' FluxTransformer2DModel (FLUX.1) or Flux2Transformer2DModel (FLUX.2), with forward hooks,
so a GPU run can be diffed against flux-sim with `flux-oracle diff`. FLUX.2: leave out
`pooled_projections` (it has none) and pass the pipeline's ids as they are (the int64 [B, S, 4]
tables are stored as the transformer uses them); the config attribute names the family
(`_class_name`), so flux-sim replays it as FLUX.2. Installed as the `flux_dump` package
(`pip install ./python`); in a flux-sim checkout `tools/torch/torch_dump.py` re-exports it
(`from torch_dump import FluxDumper`).

    from flux_dump import FluxDumper, pipeline_timesteps
    # after retrieve_timesteps(scheduler, ...): scheduler.timesteps has N values and
    # scheduler.sigmas the N+1 sigmas (including the final 0)
    timesteps, sigmas = scheduler.timesteps, scheduler.sigmas
    B = latents.shape[0]
    with FluxDumper("run.h5", transformer) as d:              # hooks every named module
        d.write_inputs(hidden_states=latents, encoder_hidden_states=prompt_embeds,
                       pooled_projections=pooled, img_ids=img_ids, txt_ids=txt_ids,
                       guidance=guidance, sigmas=sigmas,
                       timesteps=pipeline_timesteps(timesteps, latents.dtype))
        for i, t in enumerate(timesteps):
            # what FluxPipeline passes: a 1-D timestep of B values (a 0-d tensor crashes inside
            # the time embedding), cast to the latents' dtype, THEN divided in that dtype; in bf16
            # bf16(bf16(t)/1000), which pipeline_timesteps() above records too. (Recording
            # (timesteps / 1000).to(bf16) instead, bf16(t/1000), differs: 0.61328125 vs 0.6171875
            # for t = 613.5, and close() refuses the dump.)
            timestep = t.expand(B).to(latents.dtype) / 1000
            with d.step(i, timestep=timestep, sigma=sigmas[i], sigma_next=sigmas[i + 1]):
                d.record("latents_in", latents)
                v = transformer(hidden_states=latents, timestep=timestep, guidance=guidance,
                                pooled_projections=pooled, encoder_hidden_states=prompt_embeds,
                                txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
                latents = scheduler.step(v, t, latents, return_dict=False)[0]
                d.record("latents_out", latents)
        d.final(latents)
    # leaving the `with` block normally marks the file complete (root attribute complete = 1)
    # and renames it from its temporary (run.h5.tmp.<pid>.<host>) into place; an exception
    # inside it leaves the file without the marker (readers report it partial), at run.h5 only
    # if nothing was there: a previous dump is never replaced by a partial one. SIGKILL leaves
    # only the temporary, removed by the next FluxDumper of the path or `flux-sim --clean`.
    # flux-sim replays it in any precision: flux-sim --weights W --inputs run.h5 (docs/bf16.md
    # for a bf16 run's three-command verdict; tests/torch_package.sh runs this recipe in bf16).

Parallel runs: one file per rank. Put `{rank}` in the path (`FluxDumper("run/rank_{rank}.h5",
transformer)`; the folder is made) and every rank runs the recipe with the pipeline's whole inputs
and latents. The `parallel` attribute (world, rank, mesh, sharding: flux-dump's per-rank form, the
one flux-sim's --dump-per-rank writes) is written after each step, the map worked out by the dumper:
  - diffusers context parallelism (`transformer.enable_parallelism(config=ContextParallelConfig(..))`):
    from the ContextParallelConfig the model carries (or `cp_config=`) and its `_cp_plan` (or
    `cp_plan=`): the root's split inputs make the text, image and joint [txt, img] sequences,
    chunked as diffusers chunks them (even; `ring_anything`/`ulysses_anything`: tensor_split), a
    ContextParallelOutput's module (proj_out) is "replicated"; at the end of the first step the
    ranks' local shapes are all-gathered once (a collective: every rank must record that step;
    `gather_shapes=False` judges each rank alone). flux_dump.sharding.cp_sharding has the rules.
  - DTensor outputs (torch >= 2.0): the local tensor is stored, its placements give the entry.
  - diffusers' own tensor parallelism (`enable_parallelism(config=TensorParallelConfig(..))`,
    diffusers >= 0.42): from the TensorParallelConfig the model carries and its `_tp_plan`
    (flux_dump.declare_flux_tp, called here; default_entry "replicated"), FLUX.1 and FLUX.2 (a
    packed column-parallel Linear: a piece of each block per rank).
  - hand-written Megatron modules: flux_dump.declare_shard(module, rank, world, dim) ("this
    module's output is shard r of N on dim d"), declare_partial(module) (a row-parallel Linear's
    output before its all-reduce: listed under `partial` beside `sharding`), declare_replicated;
    `default_entry="replicated"` for every name not declared; declare_packed_shard(module, rank,
    world, dim, blocks) for a fused Linear split block by block (several intervals per rank);
    declare_flux_tp(model, rank, world) declares a TP that follows a FLUX `_tp_plan` in one call.
  `d.declare(name, entry)` sets one entry by hand; `parallel=` keys given by the user are kept.
  Names the dumper cannot place are left out of the map and listed under `unmapped`, with a warning.
  docs/peers.md: the recipe per engine and what flux-oracle reads.

Naming (the format's rules): a dataset per module output, named by its path in
`model.named_modules()`; a tuple output stores element k as `name#k` (None elements skipped); a
module called again within one forward stores `name@1`, `name@2`, ...; each step group gets the
`order` attribute (hook firing order) and the root gets format/version/producer/dtype/config.
Hooks fire only inside `step()`, so anything run outside it (e.g. a VAE) is not recorded.

Size savers, both invisible to readers: `dedupe=True` stores bitwise-identical tensors once and
hard-links the other names (HDF5 hard links, as the reference dumps do); `compress=True` stores
datasets of >= 256 elements as one shuffle+deflate chunk.

Completeness (docs/dump-format.md): the root attribute `complete` = 1 is written as the very
last action, when the `with` block (or close()) ends without an exception and every step that
was started has ended and /final/latents exists; a run that raises leaves a file flux-oracle
reports as partial. Steps are checked against /inputs/sigmas (N+1 values: N steps); when only
some steps were recorded, `recorded_steps` ("0,3") says which, and each step left out must have
run the model outside step() (a deliberate subset still runs every step): a loop that stopped
early (a break, an exception the caller caught) stays partial, whatever the number of forwards
per step (true CFG runs two).

What was run is recorded as it was passed: `dtype` is the run's dtype (the model's parameters,
or `dtype=`), each step's `timestep` attribute is the value passed to the transformer (a tensor
is read in its own dtype, e.g. bfloat16-rounded), and /inputs/timesteps must hold those values
(checked at the end: a mismatch raises instead of marking the file complete).

Options: `modules=` a predicate on the module name to record a subset (then pass
`recorded_modules=` text for the attribute, "depth<=N" or "all"); `parallel=` a dict for the
`parallel` attribute (its keys win over the dumper's; its `sharding` entries are merged in);
`rank=`/`world=` when there is no torch.distributed process group; `dtype=`
overrides the run's dtype name; `recorded_steps=` ("0,1") declares a deliberate subset of the
schedule the caller runs (e.g. only its first steps): the steps recorded must be exactly those,
and then the steps left out need not have run. bfloat16 tensors are stored as float32 (HDF5 has no bfloat16), as the format
says. Needs torch, h5py, numpy; diffusers is not imported here.
"""
import contextlib
import hashlib
import json
import os
import re
import socket
import sys

import h5py
import numpy as np

from . import sharding as _sh
from ._parallel import _ParallelState

FORMAT_VERSION = 1
CONFIG_KEYS = ["patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers",
               "attention_head_dim", "num_attention_heads", "joint_attention_dim",
               "pooled_projection_dim", "guidance_embeds", "axes_dims_rope"]
# FLUX.2 (diffusers' Flux2Transformer2DModel): no pooled vector; these instead. flux-sim tells the
# families apart by `_class_name` and refuses these keys in a FLUX.1 config
FLUX2_CONFIG_KEYS = ["patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers",
                     "attention_head_dim", "num_attention_heads", "joint_attention_dim",
                     "timestep_guidance_channels", "mlp_ratio", "axes_dims_rope", "rope_theta", "eps",
                     "guidance_embeds"]
FLUX_CLASSES = ("FluxTransformer2DModel", "Flux2Transformer2DModel")
_FLUX2_ONLY = ("timestep_guidance_channels", "mlp_ratio", "rope_theta")


def _class_name(model, cfg):
    """diffusers' class name of the family for the config's `_class_name` (diffusers' config.json
    has it; `model.config` does not): the config's own, else the model's class when it is one of
    diffusers' two FLUX transformers (a subclass counts), else FLUX.2 when the config has FLUX.2's
    keys; None for anything else (a FLUX-named toy: flux-sim reads a config without one as FLUX.1)."""
    c = cfg.get("_class_name") if hasattr(cfg, "get") else None
    if c:
        return c
    for k in type(model).__mro__:
        if k.__name__ in FLUX_CLASSES:
            return k.__name__
    if any(k in cfg for k in _FLUX2_ONLY):
        return "Flux2Transformer2DModel"
    return None


def _flux_config(model, cfg):
    """The root `config` attribute: the family's keys of the model's config, `_class_name` first."""
    cls = _class_name(model, cfg)
    keys = FLUX2_CONFIG_KEYS if cls == "Flux2Transformer2DModel" else CONFIG_KEYS
    out = {"_class_name": cls} if cls else {}
    out.update({k: cfg[k] for k in keys if k in cfg})
    if "axes_dims_rope" in out:
        out["axes_dims_rope"] = list(out["axes_dims_rope"])
    return out


# The temporary the dump is written to until it is complete, named as flux-sim names its own
# (sim/run/fs_dump.c): "<name>.tmp.<pid>.<host>" beside the final path, the name cut so that the
# temporary's stays at most 128 characters. A writer killed with SIGKILL or SIGTERM leaves only
# that, never a file at the final path; the next FluxDumper of the same path on this host, or
# `flux-sim --clean PATH`, removes it once its process is gone.
TMP_NAME_MAX = 128


def _host_token():
    h = (socket.gethostname() or "localhost").split(".")[0][:32]
    h = re.sub(r"[^A-Za-z0-9_-]", "_", h)
    return h or "localhost"


def _tmp_name(path, pid, host):
    d, base = os.path.split(path)
    suffix = f".tmp.{pid}.{host}"
    if len(base) + len(suffix) > TMP_NAME_MAX:
        base = base[:TMP_NAME_MAX - len(suffix)]
    return os.path.join(d, base + suffix)


def _pid_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return st[st.rindex(")") + 2] not in "ZX"     # a zombie is gone
    except (OSError, ValueError, IndexError):
        return True


def _remove_stale(path):
    """Temporaries of `path` written on this host by a process that is gone."""
    d = os.path.dirname(path) or "."
    host = _host_token()
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        m = re.fullmatch(r"(.*)\.tmp\.([0-9]{1,10})\.([A-Za-z0-9_-]+)", n)
        if not m or m.group(3) != host:
            continue
        pid = int(m.group(2))
        full = os.path.join(d, n)
        if os.path.basename(_tmp_name(path, pid, host)) != n or pid == os.getpid() or _pid_running(pid):
            continue
        try:
            with open(full, "rb") as f:
                head = f.read(8)
            if head in (b"", b"\x89HDF\r\n\x1a\n"):
                os.unlink(full)
        except OSError:
            pass


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


def pipeline_timesteps(timesteps, dtype, batch=None):
    """What FluxPipeline passes to the transformer as `timestep` for each of `timesteps` (the
    scheduler's t, 0..1000): `t.expand(B).to(latents.dtype)`, then `/ 1000` in that dtype. In bf16
    that is bf16(bf16(t)/1000) (0.6171875 for t = 613.5), not bf16(t/1000) (0.61328125). Use it
    both for /inputs/timesteps and for the value passed at each step (the dumper checks that they
    agree). Returns a 1-D tensor of N values, or an [N, B] one with `batch=B`."""
    import torch
    t = torch.as_tensor(timesteps)
    if batch is not None:
        t = t.reshape(-1, 1).expand(-1, batch)
    return t.to(dtype) / 1000


class FluxDumper:
    def __init__(self, path, model, config=None, dtype=None, producer=None, modules=None,
                 recorded_modules="all", parallel=None, dedupe=True, compress=False, extra_attrs=None,
                 recorded_steps=None, rank=None, world=None, cp_config=None, cp_plan=None, gather_shapes=True,
                 default_entry=None):
        self.model = model
        self.modules = modules
        self.dedupe, self.compress = dedupe, compress
        self._par = _ParallelState(model, parallel, rank, world, cp_config, cp_plan, gather_shapes, default_entry)
        path = os.fspath(path)
        if "{rank}" in path:          # one file per rank: "run/rank_{rank}.h5"
            if self._par.rank is None:
                raise ValueError(f"{path}: '{{rank}}' in the path, but the rank is unknown (no torch.distributed "
                                 f"process group, no rank=)")
            path = path.replace("{rank}", str(self._par.rank))
            if os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        _remove_stale(self.path)
        self.tmp = _tmp_name(self.path, os.getpid(), _host_token())
        self.f = h5py.File(self.tmp, "w", track_order=True)
        cfg = _flux_config(model, config if config is not None else getattr(model, "config", {}))
        a = self.f.attrs
        a["format"] = "flux-dump"
        a["version"] = FORMAT_VERSION
        a["producer"] = producer or f"tools/torch/torch_dump.py + {type(model).__name__} forward hooks"
        a["dtype"] = dtype or _dtype_name(model)
        a["config"] = json.dumps(cfg)
        if parallel is not None:
            a["parallel"] = json.dumps(parallel)     # completed with the map after the first step
        for k, v in (extra_attrs or {}).items():
            a[k] = v
        self.recorded_modules = recorded_modules
        self.recorded_steps = recorded_steps
        self._steps_done, self._steps_open = [], 0
        self._passed_t = {}     # step -> timestep value passed to the transformer
        self._inputs = {}       # name -> numpy array written to /inputs
        self._final = False
        self._group = None
        self._handles = []
        self._seen = {}   # (dtype, shape, digest) -> dataset, across steps (pos_embed repeats)
        self._forwards = 0  # calls of the model itself, recorded or not: a loop that stopped early
        self._forwards_outside = 0   # ... of which outside step(): the steps deliberately not recorded
        self._handles.append(model.register_forward_hook(self._count_forward))
        self._hook_all()

    def _count_forward(self, module, inputs, output):
        self._forwards += 1
        if self._group is None:
            self._forwards_outside += 1

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
            self._store(name if k == 0 else f"{name}@{k}", output, getattr(module, _sh._ATTR, None))
        return hook

    def _store(self, name, out, decl=None):
        import torch
        if out is None:
            return
        if isinstance(out, torch.Tensor):
            if _sh.is_dtensor(out):            # its placements say how it is distributed
                self._par.note_dtensor(name, out)
                out = out.to_local()
            elif decl is not None:
                self._par.note_declared(name, decl, tuple(out.shape))
            self.record(name, out)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                self._store(f"{name}#{i}", o, decl)
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
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            # HDF5 reads '/' as a path: 'evil/../../x' became nested groups
            raise ValueError(f"record({name!r}): a dataset name is not empty, '.' or '..', and holds no '/'")
        if name in self._order_set:
            raise ValueError(f"{name} recorded twice in {self._group.name}")
        if not isinstance(tensor, np.ndarray) and _sh.is_dtensor(tensor):
            self._par.note_dtensor(name, tensor)
            tensor = tensor.to_local()
        arr = _to_numpy(tensor) if not isinstance(tensor, np.ndarray) else tensor
        self._write(self._group, name, arr)
        self._par.note_shape(name, tuple(arr.shape))
        self._order.append(name)
        self._order_set.add(name)

    @staticmethod
    def _scalar(v, what):
        """The value of a number or a tensor/array (0-d, or 1-D of B equal values, as diffusers'
        timestep), exactly as held in its own dtype."""
        a = _to_numpy(v) if not isinstance(v, (int, float, np.ndarray, np.generic)) else np.asarray(v)
        a = np.asarray(a, dtype=np.float64).reshape(-1)
        if a.size == 0 or not np.all(a == a[0]):
            raise ValueError(f"{what} must be one value (or B equal values), got {a}")
        return float(a[0])

    @contextlib.contextmanager
    def step(self, index, timestep, sigma, sigma_next):
        g = self.f.create_group(f"step_{index:04d}", track_order=True)
        t = self._scalar(timestep, "timestep")
        for k, v in (("timestep", t), ("sigma", self._scalar(sigma, "sigma")),
                     ("sigma_next", self._scalar(sigma_next, "sigma_next"))):
            g.attrs[k] = v
        g.attrs["recorded_modules"] = self.recorded_modules
        self._group, self._order, self._order_set, self._calls = g, [], set(), {}
        self._steps_open += 1
        try:
            yield self
        except BaseException:
            # no `order`: a reader sees this step as unfinished, whatever else is on disk
            self._group = None
            raise
        g.attrs["order"] = np.array(self._order, dtype=h5py.string_dtype())
        self._group = None
        self._steps_open -= 1
        self._steps_done.append(index)
        self._passed_t[index] = t
        self._write_parallel()      # the map is known once a step ran (the first: with every rank)

    def declare(self, name, entry):
        """Set a dataset's sharding entry by hand ("replicated", {"dim": d, "ranges": ...}, or
        "partial-sum"), overriding what the dumper worked out."""
        self._par.declare(name, entry)

    def _write_parallel(self):
        if self.f and self._par.active:
            js = self._par.json()
            if js is not None and self.f.attrs.get("parallel") != js:
                self.f.attrs["parallel"] = js

    def write_inputs(self, **tensors):
        """/inputs, stored as given. `sigmas` must be the scheduler's N+1 values (the final 0
        included) and `timesteps` the N values passed to the transformer (already / 1000).
        `img_ids`/`txt_ids` as the pipeline passes them ([B, S, axes], integer for FLUX.2) are
        stored as the transformer uses them: ids[0], as floats. FLUX.2 has no `pooled_projections`
        (None or left out)."""
        arrs = {k: (_to_numpy(v) if not isinstance(v, np.ndarray) else np.asarray(v))
                for k, v in tensors.items() if v is not None}
        passed = {k: tuple(a.shape) for k, a in arrs.items()}   # as the model gets them: the CP plan splits these
        for k in ("img_ids", "txt_ids", "negative_txt_ids", "image_latent_ids"):   # negative_*: true CFG; image_*: the KV cache
            a = arrs.get(k)
            if a is None:
                continue
            if a.ndim == 3:
                # the pipelines pass [B, S, axes] (FLUX.2: int64, 4 axes); both transformers use
                # ids[0], the [S, axes] table the format stores
                a = a[0]
            if a.dtype.kind in "iub":
                # integer positions as floats of the run (exact below 2^24), as the references store them
                a = a.astype(np.float64 if self.f.attrs.get("dtype") == "float64" else np.float32)
            arrs[k] = a
        s, t = arrs.get("sigmas"), arrs.get("timesteps")
        if s is not None and s.ndim != 1:
            raise ValueError(f"sigmas must be 1-D (the scheduler's N+1 sigmas), got shape {s.shape}")
        if s is not None and t is not None and (t.ndim != 1 or len(s) != len(t) + 1):
            raise ValueError(f"sigmas must hold one more value than timesteps (N+1 vs N), got {len(s)} and "
                             f"{t.shape}: pass scheduler.sigmas, not sigmas[:-1]")
        g = self.f.require_group("inputs")
        for k, a in arrs.items():
            g.create_dataset(k, data=a)
            self._inputs[k] = a
            self._par.note_input(k, passed[k])

    def final(self, latents):
        g = self.f.require_group("final")
        g.create_dataset("latents", data=_to_numpy(latents) if not isinstance(latents, np.ndarray) else latents)
        self._final = True

    def _finish(self):
        """Checks the run is whole and writes the completeness marker, as the last action."""
        if self._steps_open:
            raise RuntimeError("a step() is still open")
        if not self._final:
            raise RuntimeError("final() was not called: the dump stays partial")
        s, t = self._inputs.get("sigmas"), self._inputs.get("timesteps")
        n = len(s) - 1 if s is not None else None
        done = sorted(set(self._steps_done))
        for i in done:   # the timesteps recorded are the ones passed
            if t is not None and i < len(t) and float(np.float64(t[i])) != self._passed_t[i]:
                raise ValueError(f"/inputs/timesteps[{i}] = {float(t[i])!r} but step {i} passed "
                                 f"{self._passed_t[i]!r}: record the values actually passed")
        if n is not None and any(i < 0 or i >= n for i in done):
            raise RuntimeError(f"steps {done} recorded, but /inputs/sigmas announces {n} steps (0..{n - 1})")
        missing = n - len(done) if n is not None else 0
        declared = self.recorded_steps not in (None, "all")
        if declared:
            # the caller declared the subset it runs (e.g. only the first steps of the schedule,
            # tools/torch/torch_flux.py --steps): it must be exactly the steps recorded
            want = sorted(int(x) for x in str(self.recorded_steps).split(",") if x.strip())
            if want != done:
                raise RuntimeError(f"recorded_steps={self.recorded_steps!r} declared, but steps {done} were recorded: "
                                   f"the dump stays partial")
        if missing > 0 and not declared and self._forwards_outside < missing:
            # steps were left out because the loop stopped (a break, an exception caught by the
            # caller), not on purpose: a deliberate subset still runs the model at every step it
            # does not record, outside step(). Counted outside step() only, so that a run calling
            # the model more than once per step (true CFG: twice) cannot make up for a step it
            # never ran
            raise RuntimeError(f"{missing} of {n} steps not recorded, but the model ran only {self._forwards_outside} "
                               f"time(s) outside step(): the loop stopped early (steps recorded: {done}); the dump "
                               f"stays partial")
        self._write_parallel()
        rs = self.recorded_steps
        if rs is None and n is not None and done != list(range(n)):
            rs = ",".join(str(i) for i in done)      # a deliberate subset: say which
        if rs is not None and rs != "all":
            self.f.attrs["recorded_steps"] = rs
        self.f.attrs["complete"] = np.int64(1)

    def close(self, ok=True):
        """Removes the hooks and closes the file; ok=True (a normal end) marks it complete."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.f:
            complete = False
            try:
                if ok:
                    self._finish()
                    complete = True
            finally:
                self.f.flush()
                self.f.close()
                self.f = None
                self._publish(complete)

    def _publish(self, complete):
        """A complete dump replaces whatever is at the path (fsync'd first, then renamed). A
        partial one (the run raised, or _finish refused) goes to the path only when nothing is
        there, so a reader says why it is partial; a previous dump at the path is never
        replaced by a partial one, which then stays at the temporary's name."""
        if complete:
            fd = os.open(self.tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.tmp, self.path)
            return
        try:
            os.link(self.tmp, self.path)   # fails if something is there: never replaces it
            os.unlink(self.tmp)
        except FileExistsError:
            print(f"torch_dump: the run did not finish; the dump already at {self.path} is kept, this run's "
                  f"partial dump is {self.tmp}", file=sys.stderr)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(ok=exc_type is None)
