# gdb helpers for flux-sim.  Load with:  gdb -x tools/flux-sim.gdb --args build/flux-sim ...
# (docs/debugging.md walks through a divergence with them)

# --break-on-divergence calls fs_check_break (which raises SIGTRAP); stopping at its entry puts
# `dv` (struct fs_divergence) in scope. `up 4` is then the layer itself (linear, qk_norm, ...).
set breakpoint pending on
break fs_check_break

define fs-where
  printf "flux-sim: step %d, module %s\n", fs_debug_step, fs_debug_module
end
document fs-where
Print the denoising step and the diffusers module path the forward is in (the last one recorded).
end

define fs-tensor
  if $argc == 1
    call (void)fs_debug_print_tensor($arg0, 0, 8)
  else
    call (void)fs_debug_print_tensor($arg0, $arg1, $arg2)
  end
end
document fs-tensor
fs-tensor PTR [FIRST N]: shape, dtype, min/max/mean/std, NaN/Inf counts and N elements from FIRST
(flat index) of an fs_tensor *.
end

define fs-divergence
  printf "flux-sim: rank %d diverged at step %d, %s\n", dv->rank, dv->step, dv->module
  printf "worst element at global coordinates (%ld, %ld, %ld, %ld)\n", dv->coords[0], dv->coords[1], dv->coords[2], dv->coords[3]
  printf "this rank's tensor:\n"
  call (void)fs_debug_print_tensor(dv->local, 0, 8)
  printf "single-rank reference (global layout):\n"
  call (void)fs_debug_print_tensor(dv->reference, 0, 8)
  printf "parallel run, assembled (global layout):\n"
  call (void)fs_debug_print_tensor(dv->global, 0, 8)
end
document fs-divergence
After --break-on-divergence stopped at fs_check_break: where, and the local, reference and
assembled tensors.
end
