# gdb helpers for flux-sim.  Load with:  gdb -x tools/debug/flux-sim.gdb --args build/flux-sim ...
# (docs/debugging.md walks through a divergence with them)
#
# Why Python and not `call fs_debug_print_tensor(...)`: an inferior call makes gdb save and
# restore the stopped thread's whole register state. gdb 13 (Debian 12) cannot write back the
# XSAVE area of a CPU with AMX ("Couldn't write extended state status: Bad address"), so on
# such a machine every helper that called into the process printed nothing. These read the
# tensor's memory with ptrace instead (gdb.Inferior.read_memory) and compute the statistics in
# gdb's Python, the same formulas and printf formats as fs_debug_print_tensor (sim/model/fs_debug.c):
# nothing runs inside the stopped process, whatever the CPU. Only a tensor in GPU memory, which
# ptrace cannot read, still goes through the inferior call (cuda-gdb handles it there).

# --break-on-divergence calls fs_check_break (which raises SIGTRAP); stopping at its entry puts
# `dv` (struct fs_divergence) in scope. `fs-layer` then selects the layer itself (fs_linear,
# fs_qk_norm, ...).
set breakpoint pending on
break fs_check_break

define fs-layer
  frame function fs_layer_record
  up
end
document fs-layer
From fs_check_break, select the layer function whose record diverged (fs_linear, fs_qk_norm, ...):
the caller of fs_layer_record. The number of frames between them depends on the build's inlining
and tail calls (4 at -O2, 5 in make sanitize's -O1 build), so count none.
end

define fs-where
  printf "flux-sim: step %d, module %s\n", fs_debug_step, fs_debug_module
end
document fs-where
Print the denoising step and the diffusers module path the forward is in (the last one recorded).
end

python
import array
import math

import gdb

# cpu-strict tags its pointers with this bit (sim/backend/fs_backend_strict.c, x86-64); the memory behind
# the untagged address is ordinary host memory.
_FS_STRICT_TAG = 1 << 62
_FS_DTYPES = {0: ("float32", 4), 1: ("float64", 8), 2: ("bfloat16", 2)}  # enum fs_dtype


def _fs_values(t):
    """The elements of fs_tensor `t` (a gdb.Value of the struct) as a list of floats, or a
    string saying why they cannot be read from here."""
    dt = int(t["dtype"])
    if dt not in _FS_DTYPES:
        return "unknown dtype %d" % dt
    name, size = _FS_DTYPES[dt]
    n = 1
    for i in range(int(t["ndim"])):
        n *= int(t["shape"][i])
    addr = int(t["data"].cast(gdb.lookup_type("unsigned long")))
    be = t["be"]
    if int(be) != 0 and not int(be["host_addressable"]):
        if be["name"].string() == "cpu-strict" and addr & _FS_STRICT_TAG:
            addr &= ~_FS_STRICT_TAG
        else:
            return None  # device memory: ptrace cannot read it
    raw = bytes(gdb.selected_inferior().read_memory(addr, n * size))
    if name == "float32":
        return array.array("f", raw).tolist()
    if name == "float64":
        return array.array("d", raw).tolist()
    wide = bytearray(4 * n)  # bfloat16 is the high half of a float32
    wide[2::4] = raw[0::2]
    wide[3::4] = raw[1::2]
    return array.array("f", bytes(wide)).tolist()


def _fs_print_tensor(ptr, first=0, count=8):
    """fs_debug_print_tensor's output, computed here from the tensor's memory."""
    if int(ptr) == 0 or int(ptr.dereference()["data"]) == 0:
        print("(no tensor)")
        return
    t = ptr.dereference()
    vals = _fs_values(t)
    if vals is None:
        gdb.execute("call (void)fs_debug_print_tensor((const fs_tensor *)%d, %d, %d)" % (int(ptr), first, count))
        return
    if isinstance(vals, str):
        print("(cannot read the tensor: %s)" % vals)
        return
    nan = inf = fin = 0
    mn, mx, s, s2 = math.inf, -math.inf, 0.0, 0.0
    for v in vals:
        if v != v:
            nan += 1
        elif v in (math.inf, -math.inf):
            inf += 1
        else:
            fin += 1
            mn = v if v < mn else mn
            mx = v if v > mx else mx
            s += v
            s2 += v * v
    mean = s / fin if fin else 0.0
    sd = math.sqrt(max(s2 / fin - mean * mean, 0.0)) if fin else 0.0
    shape = "[" + ", ".join(str(int(t["shape"][i])) for i in range(int(t["ndim"]))) + "]"
    print("tensor %s %s: min %.6g max %.6g mean %.6g std %.6g, %d NaN, %d Inf"
          % (shape, _FS_DTYPES[int(t["dtype"])][0], mn, mx, mean, sd, nan, inf))
    first = max(first, 0)
    end = min(first + count, len(vals))
    print("  [%d:%d]" % (first, end) + "".join(" %.7g" % v for v in vals[first:end]))


class FsTensor(gdb.Command):
    """fs-tensor PTR [FIRST N]: shape, dtype, min/max/mean/std, NaN/Inf counts and N elements
from FIRST (flat index) of an fs_tensor * (or fs_tensor). Reads memory; calls nothing."""

    def __init__(self):
        super().__init__("fs-tensor", gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        argv = gdb.string_to_argv(arg)
        if len(argv) not in (1, 3):
            raise gdb.GdbError("usage: fs-tensor PTR [FIRST N]")
        v = gdb.parse_and_eval(argv[0])
        if v.type.strip_typedefs().code != gdb.TYPE_CODE_PTR:
            v = v.address
        first, count = (int(gdb.parse_and_eval(argv[1])), int(gdb.parse_and_eval(argv[2]))) if len(argv) == 3 else (0, 8)
        _fs_print_tensor(v, first, count)


class FsDivergence(gdb.Command):
    """fs-divergence: after --break-on-divergence stopped at fs_check_break, where, and the
local, reference and assembled tensors of `dv`."""

    def __init__(self):
        super().__init__("fs-divergence", gdb.COMMAND_DATA)

    def invoke(self, arg, from_tty):
        dv = gdb.parse_and_eval("dv")
        print("flux-sim: rank %d diverged at step %d, %s" % (int(dv["rank"]), int(dv["step"]), dv["module"].string()))
        c = [int(dv["coords"][i]) for i in range(4)]
        print("worst element at global coordinates (%d, %d, %d, %d)" % tuple(c))
        for label, field in (("this rank's tensor:", "local"),
                             ("single-rank reference (global layout):", "reference"),
                             ("parallel run, assembled (global layout):", "global")):
            print(label)
            _fs_print_tensor(dv[field])


FsTensor()
FsDivergence()
end
