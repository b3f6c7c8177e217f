"""flux_dump — write flux-dump v1 files (flux-sim's ../shared/flux-dump.md) from a PyTorch run of
diffusers' FluxTransformer2DModel (or any model named like it) with forward hooks, one file per
rank for a parallel run, with the sharding map flux-oracle needs. See flux_dump.dumper's docstring
and flux-sim's docs/peers.md."""
from .dumper import FORMAT_VERSION, FluxDumper, pipeline_timesteps
from .sharding import (FLUX1_TP_PLAN, chunk_ranges, cp_layout, cp_sharding, declare_flux_tp, declare_packed_shard,
                       declare_partial, declare_replicated, declare_shard, dtensor_entry)

__version__ = "1.0.0"
__all__ = ["FluxDumper", "FORMAT_VERSION", "pipeline_timesteps", "declare_shard", "declare_partial",
           "declare_replicated", "declare_flux_tp", "declare_packed_shard", "FLUX1_TP_PLAN", "chunk_ranges", "cp_layout", "cp_sharding", "dtensor_entry"]
