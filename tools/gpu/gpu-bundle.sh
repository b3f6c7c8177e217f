#!/usr/bin/env bash
# gpu-bundle.sh — one relocatable folder to run flux-sim on a machine that has a GPU, its driver
# and cuBLAS, but no MPI, OpenBLAS or HDF5 and no package manager (the lent GPU machines;
# docs/gpu.md, "Running on a lent GPU machine").
#
#   tools/gpu/gpu-bundle.sh [OUT]        (default build/bundle; GPU=cuda|hip|"" from the environment)
#
# Contents (~42 MB):
#   bin/flux-box        flux-sim, flux-oracle, gpu_check and bench_forward in one executable,
#                       OpenBLAS and HDF5 linked statically (make STATIC_DEPS=1 B=build/static),
#                       stripped; bin/flux-sim etc. are symlinks to it. With GPU=cuda: cudart
#                       static, cuBLAS dynamic (the target machine's: found by run.sh).
#   bin/orterun, orted  Debian's Open MPI launcher (mpirun -> orterun)
#   lib/                the ldd closure of all of the above and of the MCA/PMIx components,
#                       minus the C runtime (libc, libm, libgcc_s, libstdc++, ld.so, ...) and
#                       minus CUDA/HIP (the target machine's own)
#   lib/x86_64-linux-gnu/openmpi/lib/openmpi3/   MCA components (without ucx, ofi, psm, openib,
#                       usnic, slurm: not on a one-node, shared-memory job)
#   lib/x86_64-linux-gnu/pmix2/{lib/pmix,share/pmix}   PMIx components and help
#   share/openmpi/, etc/openmpi/   help files and default MCA parameters
#   run.sh              sets OPAL_PREFIX, OPAL_SYSCONFDIR, PMIX_PREFIX, PMIX_PKGLIBDIR,
#                       PMIX_PKGDATADIR, LD_LIBRARY_PATH, OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,vader,
#                       OMPI_MCA_plm=isolated (and root/oversubscribe permissions), then runs its
#                       arguments: bundle/run.sh mpirun -np 4 flux-sim --backend cuda --check
#   gpu-check.sh, inject_check.sh   tools/gpu/gpu-check.sh and the --inject table it reuses
# The folder mirrors Debian's /usr layout under its own root, which is what lets OPAL_PREFIX
# relocate Open MPI (PMIx needs its three variables besides: it does not derive them).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-build/bundle}}
GPU=${GPU:-}
MA=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
OMPI_LIB=/usr/lib/$MA/openmpi/lib
PMIX=/usr/lib/$MA/pmix2

echo "gpu-bundle: building the static flux-box (GPU=${GPU:-none}) in build/static"
make -s -j"$(nproc)" STATIC_DEPS=1 B=build/static GPU="$GPU" build/static/flux-box

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/etc"
strip -o "$OUT/bin/flux-box" build/static/flux-box
for p in flux-sim flux-oracle gpu_check bench_forward; do ln -s flux-box "$OUT/bin/$p"; done
cp -L /usr/bin/orterun /usr/bin/orted "$OUT/bin/"
ln -s orterun "$OUT/bin/mpirun"
ln -s orterun "$OUT/bin/mpiexec"

# MCA components, help files, default parameters; PMIx components and help
mkdir -p "$OUT/lib/$MA/openmpi/lib/openmpi3" "$OUT/share" "$OUT/lib/$MA/pmix2/lib" "$OUT/lib/$MA/pmix2/share"
for c in "$OMPI_LIB"/openmpi3/*.so; do
  case "$(basename "$c")" in *ucx* | *ofi* | *psm* | *openib* | *usnic* | *slurm*) continue ;; esac
  cp -L "$c" "$OUT/lib/$MA/openmpi/lib/openmpi3/"
done
cp -rL /usr/share/openmpi "$OUT/share/"
cp -rL /etc/openmpi "$OUT/etc/"
cp -rL "$PMIX/lib/pmix" "$OUT/lib/$MA/pmix2/lib/"
cp -rL "$PMIX/share/pmix" "$OUT/lib/$MA/pmix2/share/"
[ -f "$PMIX/share/pmix-mca-params.conf" ] && cp -L "$PMIX/share/pmix-mca-params.conf" "$OUT/lib/$MA/pmix2/share/"

# The ldd closure, minus the C runtime (every Linux has its own, and mixing them breaks) and
# minus the GPU runtime (the target machine's driver-matched copy is used)
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libgcc_s|libstdc\+\+|libdl\.so|libpthread|librt\.so|libutil\.so|libresolv|libcuda\.so|libcublas|libcublasLt|libcudart|libnvidia|libamdhip64|libhsa-runtime|libamd_comgr|libdrm)'
declare -A seen=()
missing=()
closure() { # every object's dependencies, recursively through the copies
  local f lib path
  for f in "$@"; do
    while read -r lib path; do
      [ -n "$lib" ] || continue
      [[ $lib =~ $skip ]] && continue
      [ -n "${seen[$lib]:-}" ] && continue
      seen[$lib]=1
      if [ "$path" = "not" ] || [ ! -f "$path" ]; then missing+=("$lib (needed by $(basename "$f"))"); continue; fi
      cp -L "$path" "$OUT/lib/$lib"
      closure "$OUT/lib/$lib"
    done < <(ldd "$f" 2>/dev/null | awk '/=>/ {print $1, $3} !/=>/ && /\// {n=split($1,a,"/"); print a[n], $1}')
  done
}
closure "$OUT/bin/flux-box" "$OUT/bin/orterun" "$OUT/bin/orted" "$OUT"/lib/$MA/openmpi/lib/openmpi3/*.so \
  $(find "$OUT/lib/$MA/pmix2/lib" -name '*.so')
# cuBLAS is expected missing here only when it is not installed; anything else is a real gap
if [ ${#missing[@]} -gt 0 ]; then printf 'gpu-bundle: not found (left out): %s\n' "${missing[@]}"; fi

cp tools/gpu/gpu-check.sh "$OUT/gpu-check.sh"
cp tests/inject_check.sh "$OUT/inject_check.sh"

cat >"$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh — runs its arguments with this bundle's Open MPI and libraries (tools/gpu/gpu-bundle.sh).
#   ./run.sh mpirun -np 4 flux-sim --backend cuda --check ...
#   ./run.sh ./gpu-check.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ma=x86_64-linux-gnu
export OPAL_PREFIX="$here" OPAL_SYSCONFDIR="$here/etc/openmpi"
export PMIX_PREFIX="$here/lib/$ma/pmix2" PMIX_PKGLIBDIR="$here/lib/$ma/pmix2/lib/pmix"
export PMIX_PKGDATADIR="$here/lib/$ma/pmix2/share/pmix"
export PMIX_MCA_mca_base_component_path="$here/lib/$ma/pmix2/lib/pmix"
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# cuBLAS: the machine's own (CUDA toolkit, or the pip wheel PyTorch brings)
cublas=""
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/lib/$ma; do
  if ls "$d"/libcublas.so.* >/dev/null 2>&1; then cublas="$d"; break; fi
done
if [ -z "$cublas" ] && command -v python3 >/dev/null; then
  cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
fi
export LD_LIBRARY_PATH="$here/lib${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$here/bin:$PATH"
export FLUX_BUNDLE="$here"
exec "$@"
RUN
chmod +x "$OUT/run.sh" "$OUT/gpu-check.sh"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)): $(ls "$OUT/lib" | wc -l) libraries, $(ls "$OUT/lib/$MA/openmpi/lib/openmpi3" | wc -l) MCA components"
echo "  run: $OUT/run.sh mpirun -np 2 flux-sim --backend ${GPU:-cpu} --check"
