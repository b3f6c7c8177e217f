#!/usr/bin/env bash
# tools/torch/torch_dump.py misused or killed (reliability probe 3, T13), with the system torch:
#   (a) a loop that stops early (break, or an exception caught by the caller) and then calls
#       final() is not marked complete: close() raises, flux-oracle reports the file partial
#       (before: complete = 1 with recorded_steps "0", `stats` exit 0);
#   (b) the dump is written to <path>.tmp.<pid>.<host> and renamed when complete: a run that
#       raises over an existing good dump leaves that dump untouched (before: replaced by a
#       partial file), a SIGKILLed writer leaves only its temporary (before: a 7 KB file at the
#       path that flux-oracle calls corrupt), removed by the next dumper of the path;
#   (c) a dataset name holding '/' is refused (before: nested groups 'evil/..').
. "$(dirname "$0")/lib.sh"
tmpdir torchrobust
PYT=/usr/bin/python3
if ! $PYT -c "import torch, h5py, numpy" 2>/dev/null; then
  skip_all "torch_dump_robust: $PYT lacks torch/h5py/numpy — it did NOT run"
fi
cat >"$T/toy.py" <<'PY'
import os, sys, time, torch, torch.nn as nn
sys.path.insert(0, "tools/torch")
from torch_dump import FluxDumper
class Toy(nn.Module):
    config = {"patch_size": 1, "in_channels": 4, "out_channels": 4, "num_layers": 0, "num_single_layers": 0,
              "attention_head_dim": 8, "num_attention_heads": 1, "joint_attention_dim": 8,
              "pooled_projection_dim": 8, "guidance_embeds": False, "axes_dims_rope": (2, 2, 4)}
    def __init__(s):
        super().__init__(); s.proj_out = nn.Linear(4, 4)
    def forward(s, x): return (s.proj_out(x),)
def run(path, how="full", sleep=0.0):
    torch.manual_seed(0); m = Toy(); x = torch.randn(1, 3, 4); sig = torch.tensor([1.0, 0.5, 0.0])
    with FluxDumper(path, m, config=Toy.config) as d, torch.no_grad():
        d.write_inputs(hidden_states=x, sigmas=sig, timesteps=sig[:2])
        for i in range(2):
            try:
                with d.step(i, timestep=sig[i:i + 1], sigma=sig[i], sigma_next=sig[i + 1]):
                    d.record("latents_in", x)
                    if how == "slash": d.record("evil/../../x", x)
                    x = x + (sig[i + 1] - sig[i]) * m(x)[0]
                    d.record("latents_out", x)
                    if sleep: time.sleep(sleep)
            except ValueError:
                if how != "caught": raise
            if how == "break": break
            if how == "caught" and i == 0: raise ValueError("between steps")
        if how == "raise": raise RuntimeError("user code failed")
        d.final(x)
PY
cd "$T" && ln -s "$OLDPWD/tools" tools || exit 2
OR=$OLDPWD/$ORACLE
py() { $PYT -c "import sys; sys.path.insert(0, '.'); from toy import run; $1" 2>err; }

py 'run("good.h5")' && [ -f good.h5 ] && [ -z "$(ls good.h5.tmp.* 2>/dev/null)" ] && "$OR" stats -q good.h5 >/dev/null &&
  ok "a full run: good.h5 complete, no temporary" || bad "full run: $(cat err) $(ls)"

for how in break; do
  py "run('$how.h5', '$how')"; rc=$?
  "$OR" stats -q $how.h5 >out 2>&1; orc=$?
  [ $rc -ne 0 ] && grep -q 'stopped early' err && [ $orc -eq 2 ] && grep -q partial out &&
    ok "T13a $how after step 0, then final(): partial (oracle: $(cut -c1-120 out))" || bad "T13a $how: python rc $rc, oracle rc $orc: $(tail -1 err) $(cat out)"
done
# an exception between steps caught by the caller: the caller's own try around the loop body
$PYT -c "
import sys; sys.path.insert(0, '.'); import toy, torch
from torch_dump import FluxDumper
m = toy.Toy(); x = torch.randn(1, 3, 4); sig = torch.tensor([1.0, 0.5, 0.0])
with FluxDumper('caught.h5', m, config=toy.Toy.config) as d, torch.no_grad():
    d.write_inputs(hidden_states=x, sigmas=sig, timesteps=sig[:2])
    try:
        for i in range(2):
            with d.step(i, timestep=sig[i:i + 1], sigma=sig[i], sigma_next=sig[i + 1]):
                d.record('latents_in', x); x = x + m(x)[0]; d.record('latents_out', x)
            raise ValueError('between steps')
    except ValueError:
        pass
    d.final(x)
" 2>err; rc=$?
"$OR" stats -q caught.h5 >out 2>&1; orc=$?
[ $rc -ne 0 ] && [ $orc -eq 2 ] && ok "T13a exception between steps caught by the caller: partial" || bad "T13a caught: rc $rc oracle $orc $(tail -1 err) $(cat out)"

cp good.h5 keep.h5; sum=$(md5sum <keep.h5)
py 'run("keep.h5", "raise")'; rc=$?
[ $rc -ne 0 ] && [ "$(md5sum <keep.h5)" = "$sum" ] && ok "T13b a run that raises leaves the previous good dump untouched ($(grep -o 'partial dump is .*' err))" || bad "T13b overwrite: rc $rc $(cat err)"
rm -f keep.h5.tmp.*

py 'run("slash.h5", "slash")'; rc=$?
[ $rc -ne 0 ] && grep -q "holds no '/'" err && ok "T13c a name holding '/' refused: $(tail -1 err)" || bad "T13c: rc $rc $(tail -2 err)"

# SIGKILL mid-run: only the temporary, then the next dumper of the path removes it
$PYT -c "import sys; sys.path.insert(0, '.'); from toy import run; run('k.h5', sleep=30)" 2>err & p=$!
while kill -0 $p 2>/dev/null && [ -z "$(ls k.h5.tmp.* 2>/dev/null)" ]; do sleep 0.2; done; sleep 1
kill -9 $p; wait $p 2>/dev/null
t=$(ls k.h5.tmp.* 2>/dev/null)
[ ! -e k.h5 ] && [[ "$t" == k.h5.tmp.$p.* ]] && ok "T13b SIGKILL: only $t, nothing at k.h5" || bad "T13b SIGKILL: $(ls)"
py 'run("k.h5")' && [ -f k.h5 ] && [ -z "$(ls k.h5.tmp.* 2>/dev/null)" ] && ok "the next dumper of k.h5 removed the stale temporary" || bad "stale: $(ls) $(cat err)"
finish
