"""FluxDumper's side of a parallel run: which engine, this file's rank, and the `parallel` attribute
(world, rank, mesh, sharding) built as the run goes (flux_dump.sharding has the rules)."""
import json
import warnings

from . import sharding as _sh


def _dist():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist
    except ImportError:
        pass
    return None


def _cp_config_of(model, cp_config):
    """The ContextParallelConfig: given, or the one diffusers' `enable_parallelism` left on the
    model (`model._parallel_config`, a ParallelConfig or the ContextParallelConfig itself)."""
    if cp_config is not None:
        return cp_config
    pc = getattr(model, "_parallel_config", None)
    if pc is None:
        return None
    return getattr(pc, "context_parallel_config", None) if not hasattr(pc, "ring_degree") else pc


def _get(cfg, key, default=None):
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def _tp_config_of(model):
    """diffusers' TensorParallelConfig that `enable_parallelism` (diffusers >= 0.42) left on the model."""
    pc = getattr(model, "_parallel_config", None)
    return getattr(pc, "tensor_parallel_config", None) if pc is not None else None


class _ParallelState:
    def __init__(self, model, parallel, rank, world, cp_config, cp_plan, gather_shapes, default_entry=None):
        self.user = dict(parallel) if parallel else {}
        tp = _tp_config_of(model)
        if tp is not None:
            # diffusers' own TP: its `_tp_plan` says which Linears are column/row-parallel; its
            # styles hand back local tensors (no placements), so the map comes from the plan
            if _cp_config_of(model, cp_config) is not None:
                raise ValueError("diffusers context and tensor parallelism together: flux_dump does not map that yet")
            mesh = getattr(tp, "_mesh", None) or getattr(tp, "mesh", None)
            if mesh is None:
                raise ValueError("diffusers tensor parallelism without a device mesh (enable_parallelism not run?)")
            tr, tw = mesh.get_local_rank(), mesh.size()
            if (rank is not None and rank != tr) or (world is not None and world != tw):
                raise ValueError(f"rank={rank}, world={world}, but the TP mesh says rank {tr} of {tw}")
            rank, world = tr, tw
            _sh.declare_flux_tp(model, tr, tw)
            if default_entry is None:
                default_entry = "replicated"      # everything the plan does not shard is whole
        self.default = default_entry
        self.gather = gather_shapes
        self.cp = _cp_config_of(model, cp_config)
        self.plan = cp_plan if cp_plan is not None else (getattr(model, "_cp_plan", None) if self.cp is not None else None)
        if self.cp is not None and not self.plan:
            raise ValueError("context parallelism without a plan: the model has no _cp_plan and no cp_plan= was given")
        dist = _dist()
        self.group = None
        if self.cp is not None:
            R, U = int(_get(self.cp, "ring_degree", 1) or 1), int(_get(self.cp, "ulysses_degree", 1) or 1)
            self.mesh = {"tp": 1, "ulysses": U, "ring": R}
            self.world = R * U
            self.uneven = bool(_get(self.cp, "ring_anything", False) or _get(self.cp, "ulysses_anything", False))
            fm = _get(self.cp, "_flattened_mesh")
            r = None
            if fm is not None:                      # diffusers' CP rank: the flattened (ring, ulysses) mesh
                try:
                    r, self.group = fm.get_local_rank(), fm.get_group()
                except Exception:                   # noqa: BLE001 - a mesh without them: fall back
                    r = None
            self.rank = rank if rank is not None else (r if r is not None else (dist.get_rank() if dist else None))
            if self.rank is None:
                raise ValueError("context parallelism: this process's CP rank is unknown (no process group, no rank=)")
            if not 0 <= self.rank < self.world:
                raise ValueError(f"CP rank {self.rank} outside ring x ulysses = {self.world}")
        else:
            self.mesh = None
            self.world = world if world is not None else (dist.get_world_size() if dist else None)
            self.rank = rank if rank is not None else (dist.get_rank() if dist else None)
        if world is not None and self.cp is not None and world != self.world:
            raise ValueError(f"world={world} but ring_degree x ulysses_degree = {self.world}")
        self.inputs = {}          # /inputs name -> global shape
        self.shapes = {}          # recorded name -> this rank's local shape (the first seen)
        self.entries = {}         # name -> entry from DTensors and declarations
        self.partial = {}         # name -> "sum"
        self.manual = {}          # name -> entry from FluxDumper.declare
        self.cp_map, self.unmapped = None, []
        self.engines = set()
        if self.cp is not None:
            self.engines.add("diffusers-cp")
        self.dt_mesh = None
        if tp is not None:
            self.engines.add("diffusers-tp")

    @property
    def active(self):
        return bool(self.engines or self.manual or self.user)

    # ---- what the run shows ----
    def note_input(self, name, shape):
        self.inputs[name] = shape

    def note_shape(self, name, shape):
        self.shapes.setdefault(name, shape)

    def note_declared(self, name, decl, shape):
        entry, kind = _sh.declared_entry(decl, shape)
        self.engines.add("declared")
        if decl[0] in ("shard", "packed"):
            r, w = decl[1], decl[2]
            if self.rank is None:
                self.rank = r
            if self.world is None:
                self.world = w
            if (r, w) != (self.rank, self.world):
                raise ValueError(f"{name}: declared shard {r} of {w}, but this file is rank {self.rank} of {self.world}")
        self._put(name, entry, kind)

    def note_dtensor(self, name, x):
        entry, kind, W, mshape, names = _sh.dtensor_entry(x)
        self.engines.add("dtensor")
        if self.world is None:
            self.world = W
        if self.rank is None:
            import torch.distributed as dist
            self.rank = dist.get_rank()
        self.dt_mesh = {"shape": mshape, "names": list(names) if names else None}
        self._put(name, entry, kind)

    def declare(self, name, entry):
        if entry == "partial-sum":
            self.partial[name] = "sum"
            self.manual[name] = None
        else:
            self.manual[name] = entry

    def _put(self, name, entry, kind):
        if kind == "partial":
            self.partial[name] = entry
        else:
            self.entries[name] = entry

    # ---- the attribute ----
    def _cp(self):
        """The CP map: at the first call (the end of the first step, every rank there) the ranks'
        local shapes are gathered so that a shard is recognised on every rank at once; names first
        seen later are judged on this rank's shape alone."""
        gshapes = dict(self.inputs)
        layout = _sh.cp_layout(self.plan, gshapes, self.world, self.uneven)
        if self.cp_map is None:
            mine = dict(self.shapes)
            dist = _dist()
            if self.gather and dist is not None and self.world > 1:
                allv = [None] * (dist.get_world_size(self.group) if self.group is not None else dist.get_world_size())
                dist.all_gather_object(allv, mine, group=self.group)
                if len(allv) != self.world:
                    raise ValueError(f"the CP group has {len(allv)} ranks, ring x ulysses = {self.world}")
                # only names every rank recorded
                common = [n for n in mine if all(n in a for a in allv)]
                allv = [{n: a[n] for n in common} for a in allv]
                self.cp_map, self.unmapped = _sh.cp_sharding(self.plan, layout, allv)
                self.unmapped += [n for n in mine if n not in common]
            else:
                self.cp_map, self.unmapped = _sh.cp_sharding(self.plan, layout, mine, rank_of_file=self.rank)
            self._seen = set(mine)
        new = {n: s for n, s in self.shapes.items() if n not in self._seen}
        if new:
            m, u = _sh.cp_sharding(self.plan, layout, new, rank_of_file=self.rank)
            self.cp_map.update(m)
            self.unmapped += u
            self._seen |= set(new)
        if self.unmapped and not getattr(self, "_warned", False):
            self._warned = True
            warnings.warn(f"flux_dump: the sharding of {len(self.unmapped)} dataset(s) could not be worked out from "
                          f"the _cp_plan and the shapes (left out of the map): {self.unmapped[:5]}")
        return self.cp_map

    def json(self):
        sharding = {}
        if "diffusers-cp" in self.engines:
            sharding.update(self._cp())
        sharding.update(self.entries)
        for n, e in self.manual.items():
            sharding.pop(n, None)
            if e is not None:
                sharding[n] = e
        for n in self.partial:
            sharding.pop(n, None)
        if self.default is not None:        # e.g. "replicated": all a TP run does not declare
            for n in self.shapes:
                if n not in sharding and n not in self.partial and n not in self.manual:
                    sharding[n] = self.default
        if not self.engines and not self.manual:
            return json.dumps(self.user) if self.user else None   # as given
        p = {}
        if self.world is not None:
            p["world"] = int(self.world)
        if self.rank is not None:
            p["rank"] = int(self.rank)
        mesh = self.mesh
        if mesh is None and self.world is not None:
            names = (self.dt_mesh or {}).get("names") or []
            mesh = {"tp": self.world, "ulysses": 1, "ring": 1}
            if len(names) == 1 and names[0] in ("ring", "ulysses"):
                mesh = {"tp": 1, "ulysses": 1, "ring": 1, names[0]: self.world}
        if mesh is not None:
            p["mesh"] = mesh
        p["engine"] = ",".join(sorted(self.engines)) or "declared"
        if "diffusers-cp" in self.engines:
            p["chunks"] = "uneven (tensor_split: *_anything)" if self.uneven else "even (chunk)"
        if self.dt_mesh is not None:
            p["dtensor_mesh"] = self.dt_mesh
        p["sharding"] = sharding
        if self.partial:
            p["partial"] = dict(self.partial)
        if self.unmapped:
            p["unmapped"] = list(self.unmapped)
        for k, v in self.user.items():          # what the user passed wins, its sharding merged in
            if k == "sharding":
                p["sharding"].update(v)
            else:
                p[k] = v
        return json.dumps(p)
