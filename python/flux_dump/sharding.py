"""The `sharding` map of a per-rank flux-dump (../shared/flux-dump.md, "The `parallel` attribute"),
worked out from what the parallel engine itself declares:

- diffusers context parallelism: the model's `_cp_plan` and the ContextParallelConfig
  (`cp_sharding`);
- torch DTensor: an output's device mesh and placements (`dtensor_entry`, torch >= 2.0);
- hand-written Megatron modules: declarations (`declare_shard`, `declare_partial`,
  `declare_replicated`) the user puts on a module.

An entry is what flux-sim's own writer puts in the map (sim/run/fs_sink.c `sharding_json`):
    "replicated"                                   every rank holds the whole tensor
    {"dim": d, "ranges": [[[a, b], ...], ...]}     ranges[r]: the half-open intervals of global
                                                   axis d (d >= 0) that rank r holds, in local order
    {"dims": [{"dim": .., "ranges": ..}, ...]}     split on several axes (DTensor on a 2-D mesh)
A partial sum (a row-parallel Linear's output before its all-reduce) is not a distribution the
format names; it goes to the `partial` key beside `sharding` ({name: "sum"}) and stays out of
`sharding` (a reader that knows nothing of it sees "unknown distribution", as the format says).
No torch import at module level: the plan functions run on plain data.
"""
import re

__all__ = ["chunk_ranges", "torch_chunk_ranges", "cp_layout", "cp_sharding", "declare_shard", "declare_partial",
           "declare_replicated", "declared_entry", "declare_flux_tp", "declare_packed_shard", "FLUX1_TP_PLAN", "dtensor_entry", "is_dtensor",
           "shard_entry"]


def chunk_ranges(n, world, uneven=False):
    """Rank r's interval [a, b) of an axis of n elements split over `world` ranks, as diffusers
    does: even (EquipartitionSharder: `tensor.chunk(world)`, n must divide) or `*_anything`
    (PartitionAnythingSharder: `tensor.tensor_split(world)`: the first n % world ranks one more)."""
    n, world = int(n), int(world)
    if world < 1:
        raise ValueError(f"world {world} < 1")
    if not uneven and n % world:
        raise ValueError(f"an axis of {n} does not split evenly over {world} ranks (diffusers asserts it; "
                         f"ulysses_anything / ring_anything split it unevenly)")
    base, extra = divmod(n, world)
    out, a = [], 0
    for r in range(world):
        b = a + base + (1 if r < extra else 0)
        out.append((a, b))
        a = b
    return out


def torch_chunk_ranges(n, world):
    """`torch.chunk` / DTensor Shard(d): chunks of ceil(n/world), the last ones short or empty."""
    c = -(-int(n) // int(world)) if n else 0
    return [(min(r * c, n), min((r + 1) * c, n)) for r in range(world)]


def shard_entry(dim, per_rank_intervals):
    """{"dim": d, "ranges": [[[a, b], ...] per rank]}, as flux-sim writes it."""
    return {"dim": int(dim), "ranges": [[[int(a), int(b)] for a, b in iv] for iv in per_rank_intervals]}


# ---- diffusers context parallelism -------------------------------------------------------------
def _is_cp_input(x):
    return hasattr(x, "split_dim")


def _is_cp_output(x):
    return hasattr(x, "gather_dim")


_TXT = re.compile(r"encoder|txt|context")
# names of diffusers' FLUX text stream, to tell a text shard from an image shard when both
# have the same length on every rank (the only case shapes cannot decide)
_TXT_STREAM = re.compile(r"context|\.add_|added_|to_add_out|^transformer_blocks\.\d+#0$|\.attn#1$")


def cp_layout(plan, global_shapes, world, uneven):
    """The sequence segments the plan's root (`""`) entry splits, from the global shapes of the
    inputs passed to the model (name -> shape). Returns a dict with
      segments: {"txt": (L, ranges), "img": (L, ranges), <other input>: ...}
      axis:     {ndim: split axis} (from each split input's expected_dims and split_dim)
      allowed:  {ndim: [segment names a tensor of that ndim may be a shard of]}
    Text inputs (a name with encoder/txt/context) form "txt", the other split inputs of FLUX's
    plan (hidden_states, img_ids) "img"; the joint sequence is [txt, img], as diffusers'
    FluxTransformer2DModel concatenates it (torch.cat([encoder_hidden_states, hidden_states])).
    An input whose shape does not have expected_dims is not split (diffusers warns and passes it
    whole), so it makes no segment."""
    root = plan.get("", {}) if isinstance(plan, dict) else {}
    segs, axis, allowed, derived = {}, {}, {}, []
    for name, cpi in root.items():
        cpis = list(cpi) if isinstance(cpi, (list, tuple)) else [cpi]
        if len(cpis) != 1 or not _is_cp_input(cpis[0]) or getattr(cpis[0], "split_output", False):
            continue
        cpi = cpis[0]
        shape = global_shapes.get(name)
        if shape is None:
            continue
        nd = len(shape)
        if cpi.expected_dims is not None and nd != cpi.expected_dims:
            continue
        d = cpi.split_dim % nd
        role = "txt" if _TXT.search(name) else ("img" if re.search(r"hidden_states|img", name) else name)
        L = int(shape[d])
        if role in segs and segs[role][0] != L:
            raise ValueError(f"_cp_plan: inputs of the {role} sequence disagree on its length ({segs[role][0]} vs {L} "
                             f"from {name})")
        segs[role] = (L, chunk_ranges(L, world, uneven))
        if axis.get(nd, d) != d:
            raise ValueError(f"_cp_plan splits {nd}-D inputs on different axes ({axis[nd]} and {d})")
        axis[nd] = d
        allowed.setdefault(nd, [])
        if role not in allowed[nd]:
            allowed[nd].append(role)
        if name.endswith("_ids") and nd == 3 and d >= 1:
            derived.append((role, nd - 1, d - 1))
    # FLUX.2's plan splits the ids as the pipeline passes them, [B, S, 4] on dim 1, and the
    # transformer uses ids[0]: its RoPE tables (pos_embed#k [S, D]) are shards on dim 0 of the
    # same segments. (FLUX.1's plan splits its [S, 3] ids on dim 0 itself.)
    for role, nd, d in derived:
        if axis.setdefault(nd, d) != d:
            continue
        allowed.setdefault(nd, [])
        if role not in allowed[nd]:
            allowed[nd].append(role)
    return {"segments": segs, "axis": axis, "allowed": allowed, "world": world}


def _interpretations(layout, nd):
    """[(label, axis, per-rank local extent, entry)] for a tensor of `nd` dims."""
    axis, allowed, segs, W = layout["axis"], layout["allowed"], layout["segments"], layout["world"]
    if not axis:
        return []
    if nd in axis:
        key = nd
    elif nd > max(axis):
        key = max(axis)
    else:
        return []
    d, out = axis[key], []
    for role in allowed[key]:
        L, rr = segs[role]
        out.append((role, d, [b - a for a, b in rr], shard_entry(d, [[iv] for iv in rr])))
    if "txt" in allowed[key] and "img" in allowed[key]:
        (Lt, rt), (_, ri) = segs["txt"], segs["img"]
        joint = [[rt[r], (Lt + ri[r][0], Lt + ri[r][1])] for r in range(W)]
        out.append(("joint", d, [(rt[r][1] - rt[r][0]) + (ri[r][1] - ri[r][0]) for r in range(W)],
                    shard_entry(d, joint)))
    return out


def _module_of(name):
    """'pos_embed#1' -> ('pos_embed', 1); 'proj_out' -> ('proj_out', None); '@k' calls alike."""
    base = name.split("@")[0]
    if "#" in base:
        m, k = base.rsplit("#", 1)
        return m, int(k) if k.isdigit() else None
    return base, None


def _plan_match(pattern, module):
    """diffusers' plan keys: dotted module names, one '*' standing for a ModuleList index."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", r"\d+"), module) is not None


def cp_sharding(plan, layout, shapes_by_rank, rank_of_file=None):
    """The sharding map for the recorded tensors, from every rank's local shapes of them
    (a list, index = CP rank, of {name: shape}; a single rank's dict when the ranks' shapes were
    not gathered, then only that rank's shape is checked). Returns (sharding, unmapped): the
    names it cannot decide are left out of the map (unknown distribution) and listed.

    Rules, in order: an output a ContextParallelOutput gathers (diffusers' proj_out) is
    "replicated"; an output a ContextParallelInput(split_output=True) splits is that shard; any
    other tensor is a shard of the text, image or joint [txt, img] sequence when its extent on the
    split axis equals that segment's local extent on every rank (one candidate: taken; text and
    image both fitting: FLUX's text-stream names decide), else "replicated" when every rank holds
    the same shape (time embeddings, modulation vectors; and what the user records outside the
    model: latents_in / latents_out are the pipeline's whole latents)."""
    if isinstance(shapes_by_rank, dict):
        shapes_by_rank = [shapes_by_rank]
        gathered = False
    else:
        gathered = True
    W = layout["world"]
    names = list(shapes_by_rank[0].keys())
    sharding, unmapped = {}, []
    gather_at, split_at = [], []
    for key, val in (plan or {}).items():
        if key == "":
            continue
        if _is_cp_output(val) or (isinstance(val, (list, tuple)) and val and all(_is_cp_output(x) for x in val)):
            outs = [val] if _is_cp_output(val) else list(val)
            gather_at.append((key, outs))
        elif isinstance(val, dict):
            for k, cpi in val.items():
                if isinstance(k, int) and _is_cp_input(cpi) and getattr(cpi, "split_output", False):
                    split_at.append((key, k, cpi))
    for name in names:
        local = [s.get(name) for s in shapes_by_rank]
        if any(x is None for x in local):
            unmapped.append(name)
            continue
        nd = len(local[0])
        mod, k = _module_of(name)
        if any(_plan_match(p, mod) and (k is None or k < len(outs)) and outs[k or 0] is not None
               for p, outs in gather_at):
            sharding[name] = "replicated"
            continue
        hit = [cpi for p, kk, cpi in split_at if _plan_match(p, mod) and kk == (k or 0)]
        if hit:
            d = hit[0].split_dim % nd
            ext = [s[d] for s in local]
            L = sum(ext) if gathered and len(ext) == W else None
            if L is None:
                unmapped.append(name)
                continue
            a, ranges = 0, []
            for e in ext:
                ranges.append([(a, a + e)])
                a += e
            sharding[name] = shard_entry(d, ranges)
            continue
        cands = []
        for label, d, ext, entry in _interpretations(layout, nd):
            if d >= nd:
                continue
            if gathered and len(local) == W:
                ok = all(local[r][d] == ext[r] for r in range(W))
            else:
                r = rank_of_file if rank_of_file is not None else 0
                ok = local[0][d] == ext[r]
            if ok:
                cands.append((label, entry))
        if len(cands) == 2 and {c[0] for c in cands} == {"txt", "img"}:
            want = "txt" if _TXT_STREAM.search(name) else "img"
            cands = [c for c in cands if c[0] == want]
        if len(cands) == 1:
            sharding[name] = cands[0][1]
        elif not cands and all(tuple(s) == tuple(local[0]) for s in local):
            sharding[name] = "replicated"
        else:
            unmapped.append(name)
    return sharding, unmapped


# ---- declarations (hand-written Megatron modules) ---------------------------------------------
_ATTR = "_flux_dump_sharding"


def declare_shard(module, rank, world, dim, sizes=None):
    """This module's output is shard `rank` of `world` on axis `dim` of the global tensor: even
    chunks (the global axis = world x the local one) unless `sizes` lists every rank's extent.
    E.g. a column-parallel Linear (Megatron's ColumnParallelLinear without gather_output):
    declare_shard(self, rank, world, dim=-1)."""
    setattr(module, _ATTR, ("shard", int(rank), int(world), int(dim), list(sizes) if sizes is not None else None))
    return module


def declare_partial(module, op="sum"):
    """This module's output is this rank's partial `op` (a row-parallel Linear's output before its
    all-reduce): the global tensor is the `op` of every rank's."""
    if op != "sum":
        raise ValueError(f"partial op {op!r}: only 'sum' is known")
    setattr(module, _ATTR, ("partial", op))
    return module


def declare_replicated(module):
    """This module's output is whole and the same on every rank (after an all-reduce or gather)."""
    setattr(module, _ATTR, ("replicated",))
    return module


def declare_packed_shard(module, rank, world, dim, blocks):
    """This module's output is a packed column-parallel Linear's: its global axis `dim` is the
    concatenation of blocks (proportional sizes `blocks`, e.g. [1, 1, 1, 2, 2] for FLUX.2's
    q | k | v | gate | up), each split evenly over the ranks, and rank r holds block by block its
    piece of each, concatenated (diffusers' PackedColwiseParallel)."""
    blocks = [int(b) for b in blocks]
    if not blocks or any(b <= 0 for b in blocks):
        raise ValueError(f"packed blocks {blocks}: positive proportional sizes")
    setattr(module, _ATTR, ("packed", int(rank), int(world), int(dim), blocks))
    return module


def declared_entry(decl, shape):
    """(map entry, kind) of a declaration for a local tensor of `shape`: kind "shard", "partial",
    "replicated"."""
    if decl[0] == "replicated":
        return "replicated", "replicated"
    if decl[0] == "partial":
        return decl[1], "partial"
    if decl[0] == "packed":
        _, rank, world, dim, blocks = decl
        nd = len(shape)
        if not -nd <= dim < nd:
            raise ValueError(f"declared packed shard dim {dim} outside a {nd}-D output")
        d = dim % nd
        total = shape[d] * world
        if total % sum(blocks) or any((b * (total // sum(blocks))) % world for b in blocks):
            raise ValueError(f"packed blocks {blocks} over {world} ranks do not fit a local extent of {shape[d]}")
        unit = total // sum(blocks)
        per_rank = [[] for _ in range(world)]
        o = 0
        for b in blocks:
            k = b * unit // world
            for r in range(world):
                per_rank[r].append((o + r * k, o + (r + 1) * k))
            o += b * unit
        return shard_entry(d, per_rank), "shard"
    _, rank, world, dim, sizes = decl
    nd = len(shape)
    if not -nd <= dim < nd:
        raise ValueError(f"declared shard dim {dim} outside a {nd}-D output")
    d = dim % nd
    if sizes is None:
        sizes = [shape[d]] * world
    if len(sizes) != world or sizes[rank] != shape[d]:
        raise ValueError(f"declared shard {rank} of {world} on dim {d}: sizes {sizes} do not fit the local "
                         f"extent {shape[d]}")
    a, ranges = 0, []
    for s in sizes:
        ranges.append([(a, a + s)])
        a += s
    return shard_entry(d, ranges), "shard"


# FLUX.1's tensor-parallel plan, as diffusers 0.42 ships it (FluxTransformer2DModel._tp_plan), for a
# model without one (older diffusers, hand-written TP that follows the same split)
FLUX1_TP_PLAN = {
    "transformer_blocks.*.attn.to_q": "colwise", "transformer_blocks.*.attn.to_k": "colwise",
    "transformer_blocks.*.attn.to_v": "colwise", "transformer_blocks.*.attn.to_out.0": "rowwise",
    "transformer_blocks.*.attn.add_q_proj": "colwise", "transformer_blocks.*.attn.add_k_proj": "colwise",
    "transformer_blocks.*.attn.add_v_proj": "colwise", "transformer_blocks.*.attn.to_add_out": "rowwise",
    "transformer_blocks.*.ff.net.0.proj": "colwise", "transformer_blocks.*.ff.net.2": "rowwise",
    "transformer_blocks.*.ff_context.net.0.proj": "colwise", "transformer_blocks.*.ff_context.net.2": "rowwise",
    "single_transformer_blocks.*.attn.to_q": "colwise", "single_transformer_blocks.*.attn.to_k": "colwise",
    "single_transformer_blocks.*.attn.to_v": "colwise", "single_transformer_blocks.*.proj_mlp": "colwise",
    "single_transformer_blocks.*.proj_out": "rowwise-packed",
}
# FLUX.1's modules downstream of a column-parallel Linear that still hold the rank's shard (their
# output is never all-reduced): the QK RMSNorms on the head axis of [B, S, H, D], the feed-forward's
# activation and dropout, the single blocks' MLP activation and attention output on the last axis
_FLUX1_TP_DOWNSTREAM = {
    "transformer_blocks": [("attn.norm_q", 2), ("attn.norm_k", 2), ("attn.norm_added_q", 2), ("attn.norm_added_k", 2),
                           ("ff.net.0", -1), ("ff.net.1", -1), ("ff_context.net.0", -1), ("ff_context.net.1", -1)],
    "single_transformer_blocks": [("attn.norm_q", 2), ("attn.norm_k", 2), ("act_mlp", -1), ("attn", -1)],
}


# FLUX.2 (Flux2Transformer2DModel): the double blocks' SwiGLU feed-forward (act_fn and its gate_fn
# after the packed linear_in), the single blocks' MLP activation inside the attention module; the
# single blocks' attention output is whole (its to_out is row-parallel)
_FLUX2_TP_DOWNSTREAM = {
    "transformer_blocks": [("attn.norm_q", 2), ("attn.norm_k", 2), ("attn.norm_added_q", 2), ("attn.norm_added_k", 2),
                           ("ff.act_fn", -1), ("ff.act_fn.gate_fn", -1), ("ff_context.act_fn", -1),
                           ("ff_context.act_fn.gate_fn", -1)],
    "single_transformer_blocks": [("attn.norm_q", 2), ("attn.norm_k", 2), ("attn.mlp_act_fn", -1),
                                  ("attn.mlp_act_fn.gate_fn", -1)],
}


def _is_flux2(model):
    return any(k.__name__ == "Flux2Transformer2DModel" for k in type(model).__mro__) or any(
        hasattr(getattr(b, "attn", None), "to_qkv_mlp_proj") for b in getattr(model, "single_transformer_blocks", []))


def _style_kind(style):
    """'colwise' / 'rowwise' / 'packed' / None for a _tp_plan value: a string, a torch ParallelStyle,
    or one of diffusers' packed markers (PackedRowwiseParallel: the output is whole after the
    all-reduce like any row-parallel Linear; PackedColwiseParallel: a piece of each block)."""
    if isinstance(style, str):
        return {"colwise": "colwise", "rowwise": "rowwise", "rowwise-packed": "rowwise"}.get(style)
    n = type(style).__name__
    if n in ("ColwiseParallel",):
        return "colwise"
    if n == "PackedColwiseParallel":
        return "packed"
    if n in ("RowwiseParallel", "PackedRowwiseParallel"):
        return "rowwise"
    return None


def _submodule(model, path):
    m = model
    for p in path.split("."):
        m = m[int(p)] if p.isdigit() else getattr(m, p)
    return m


def declare_flux_tp(model, rank, world, plan=None):
    """Declare a FLUX tensor-parallel model's map from its plan: each column-parallel Linear's
    output is shard `rank` of `world` on the last axis (a packed one, diffusers'
    PackedColwiseParallel: a piece of each of its blocks), each row-parallel one's is whole (after
    the all-reduce); the modules downstream that still hold the rank's shard are declared too:
    FLUX.1 the QK norms (head axis), the feed-forward activations and the single blocks' attention
    output; FLUX.2 the QK norms and the SwiGLU activations (act_fn, mlp_act_fn, their gate_fn). `plan`: a `_tp_plan`-style dict ({"blocks.*.path":
    "colwise" | "rowwise" | a torch/diffusers style}); default the model's `_tp_plan` (diffusers >=
    0.42), else FLUX1_TP_PLAN. Call it after the Linears are replaced/parallelized (the modules at the
    plan's paths are the ones declared), and create the FluxDumper with default_entry="replicated"
    (diffusers' TensorParallelConfig: FluxDumper calls this itself). A row-parallel module's own
    local product, if it records one (a child before the all-reduce), is still yours to
    declare_partial. Returns the names declared. Raises ValueError for a style it cannot map or a
    path the model lacks."""
    plan = plan if plan is not None else (getattr(model, "_tp_plan", None) or FLUX1_TP_PLAN)
    rank, world = int(rank), int(world)
    if not 0 <= rank < world:
        raise ValueError(f"TP rank {rank} outside world {world}")
    names, cols = [], set()
    for pattern, style in plan.items():
        kind = _style_kind(style)
        if kind is None:
            sn = style if isinstance(style, str) else type(style).__name__
            raise ValueError(f"_tp_plan {pattern!r}: style {sn} is not mapped by declare_flux_tp (colwise, rowwise "
                             f"and diffusers' packed styles are): declare it with declare_shard")
        head, star, tail = pattern.partition(".*.")
        try:
            paths = ([f"{head}.{i}.{tail}" for i in range(len(_submodule(model, head)))] if star else [pattern])
            mods = [(p, _submodule(model, p)) for p in paths]
        except (AttributeError, IndexError, TypeError) as e:
            raise ValueError(f"_tp_plan {pattern!r}: the model has no such module ({e})") from None
        for p, m in mods:
            if kind == "colwise":
                declare_shard(m, rank, world, dim=-1)
                cols.add(p.split(".")[0])
            elif kind == "packed":
                blocks = getattr(style, "blocks", None) or getattr(m, "_tp_packed_col_blocks", None)
                if not blocks:
                    raise ValueError(f"_tp_plan {pattern!r}: a packed column-parallel Linear without blocks "
                                     f"(no `blocks`, no _tp_packed_col_blocks on {p})")
                declare_packed_shard(m, rank, world, -1, blocks)
                cols.add(p.split(".")[0])
            else:
                declare_replicated(m)
            names.append(p)
    downstream = _FLUX2_TP_DOWNSTREAM if _is_flux2(model) else _FLUX1_TP_DOWNSTREAM
    for blocks, subs in downstream.items():
        if blocks not in cols:
            continue
        for i, blk in enumerate(getattr(model, blocks, [])):
            for path, dim in subs:
                try:
                    m = _submodule(blk, path)
                except (AttributeError, IndexError):
                    continue
                declare_shard(m, rank, world, dim=dim)
                names.append(f"{blocks}.{i}.{path}")
    return names


# ---- DTensor ------------------------------------------------------------------------------------
def _dtensor_cls():
    try:
        from torch.distributed.tensor import DTensor
        return DTensor
    except ImportError:
        pass
    try:
        from torch.distributed._tensor import DTensor
        return DTensor
    except ImportError:
        return None


def is_dtensor(x):
    cls = _dtensor_cls()
    return cls is not None and isinstance(x, cls)


def dtensor_entry(x):
    """(entry, kind, world, rank_in_mesh, mesh_shape, mesh_dim_names) of a DTensor from its device
    mesh and placements. Shard(d) on one or more mesh axes: {"dim"...} / {"dims": [...]} with
    DTensor's chunking (torch.chunk, applied mesh axis by mesh axis); all Replicate: "replicated";
    any Partial: ("sum", "partial"). The mesh must hold ranks 0..W-1 (ranges are indexed by the
    global rank)."""
    mesh = x.device_mesh
    placements = list(x.placements)
    ranks = mesh.mesh.flatten().tolist()
    W = len(ranks)
    if sorted(ranks) != list(range(W)):
        raise ValueError(f"DTensor mesh ranks {ranks}: the map needs a mesh of ranks 0..{W - 1}")
    names = getattr(mesh, "mesh_dim_names", None)
    mshape = list(mesh.mesh.shape)
    if any(p.is_partial() for p in placements):
        return "sum", "partial", W, mshape, names
    if all(p.is_replicate() for p in placements):
        return "replicated", "replicated", W, mshape, names
    gshape = list(x.shape)
    nd = len(gshape)
    # every rank's interval per tensor axis, applying the placements mesh axis by mesh axis
    coords = {}
    import itertools
    for idx in itertools.product(*[range(s) for s in mshape]):
        coords[int(mesh.mesh[idx].item())] = idx
    per_rank = {}
    for r in range(W):
        iv = [(0, n) for n in gshape]
        for md, p in enumerate(placements):
            if p.is_shard():
                d = p.dim % nd
                a, b = iv[d]
                ca, cb = torch_chunk_ranges(b - a, mshape[md])[coords[r][md]]
                iv[d] = (a + ca, a + cb)
        per_rank[r] = iv
    dims = sorted({p.dim % nd for p in placements if p.is_shard()})
    entries = [shard_entry(d, [[per_rank[r][d]] for r in range(W)]) for d in dims]
    entry = entries[0] if len(entries) == 1 else {"dims": entries}
    return entry, "shard", W, mshape, names
