#!/usr/bin/env bash
# bundle_relocation.sh — proves tools/gpu/gpu-bundle.sh's folder runs on a machine without MPI,
# OpenBLAS or HDF5: the bundle is copied to /tmp, and in a private mount namespace every system
# copy of Open MPI, PMIx, OpenBLAS, HDF5 (and their helpers) is masked — directories by an empty
# tmpfs, library files and launchers by /dev/null, so a stray load fails loudly instead of
# silently using the system's — then, in an environment with nothing but PATH=/usr/bin:/bin,
#   run.sh mpirun -np 4 flux-sim --tp 2 --ring 2 --check   (the reference config `odd`)
#   run.sh mpirun -np 4 flux-sim --ulysses 2 --ring 2 --check
# must pass, and ldd of the binary and of an MCA component must resolve into the bundle or the
# C runtime only. Needs root (unshare -m). Not part of `make test` (it rebuilds build/static).
#   tests/gpu/bundle_relocation.sh [BUNDLE]     default: build the CPU bundle into build/bundle
set -u
cd "$(dirname "$0")/../.."
ref=$(cd "${FLUX_REFERENCE_DIR:-../shared/reference}" 2>/dev/null && pwd)
B=${1:-}
if [ -z "$B" ]; then
  GPU= tools/gpu/gpu-bundle.sh build/bundle || exit 1
  B=build/bundle
fi
if ! unshare -m --propagation private true 2>/dev/null; then
  echo "*** SKIPPED: unshare -m is not permitted here — the relocation test did NOT run ***"; exit 0
fi
D=/tmp/fluxsim-bundle-reloc
rm -rf "$D"
cp -a "$B" "$D"
ma=x86_64-linux-gnu
inner=$(mktemp /tmp/fluxsim-reloc-XXXXXX.sh)
cat >"$inner" <<EOF
set -u
# directories of the system's MPI, PMIx, HDF5, OpenBLAS
for d in /usr/lib/$ma/openmpi /usr/lib/$ma/pmix2 /usr/share/openmpi /etc/openmpi /usr/lib/$ma/hdf5 \
         /usr/lib/$ma/openblas-pthread /usr/lib/$ma/blas /usr/lib/$ma/lapack; do
  [ -d "\$d" ] && mount -t tmpfs none "\$d"
done
# their libraries and launchers, file by file
for f in /usr/lib/$ma/lib{mpi,open-rte,open-pal,hdf5,openblas,blas,lapack,hwloc,event,pmix,cjson,sz,aec,gomp,munge}*.so* \
         /usr/bin/{mpirun,mpiexec,orterun,orted,ompi_info} /etc/alternatives/mpirun; do
  [ -e "\$f" ] && mount --bind /dev/null "\$f"
done
echo "masked: \$(mount | grep -c -e tmpfs -e null) mounts"
cd /tmp
echo "--- ldd flux-box (bundle environment)"
$D/run.sh ldd $D/bin/flux-box
echo "--- ldd mca_btl_vader.so"
$D/run.sh ldd $D/lib/$ma/openmpi/lib/openmpi3/mca_btl_vader.so
bad=\$( { $D/run.sh ldd $D/bin/flux-box; $D/run.sh ldd $D/bin/orterun; \
          $D/run.sh ldd $D/lib/$ma/openmpi/lib/openmpi3/mca_btl_vader.so; } | awk '/=>/ {print \$3}' | \
       grep -v -e "^$D/" -e '^/lib/$ma/lib\(c\|m\|mvec\|gcc_s\|stdc++\|dl\|pthread\|rt\)\.so' -e '^/lib64/' | sort -u)
if [ -n "\$bad" ]; then echo "FAIL: resolved outside the bundle and the C runtime: \$bad"; exit 1; fi
echo "ok   every library resolves into $D or the C runtime"
echo "--- which mpirun: \$(PATH=$D/bin:\$PATH command -v mpirun)"
for lay in "--tp 2 --ring 2" "--ulysses 2 --ring 2"; do
  echo "--- run.sh mpirun -np 4 flux-sim \$lay --check (odd, fp32)"
  $D/run.sh mpirun -np 4 flux-sim --weights $ref/odd/weights.safetensors --inputs $ref/odd/dump_fp64.h5 \
    --precision fp32 \$lay --check -q --threads 1; rc=\$?
  [ \$rc -eq 0 ] || { echo "FAIL: exit \$rc"; exit 1; }
done
echo "--- run.sh flux-oracle stats on the reference dump"
$D/run.sh flux-oracle stats $ref/odd/dump_fp64.h5 -q 2>&1 | tail -2
exit 0
EOF
if [ -z "$ref" ] || [ ! -d "$ref/odd" ]; then echo "*** SKIPPED: reference data not found ***"; exit 0; fi
env -i PATH=/usr/bin:/bin HOME=/tmp unshare -m --propagation private bash "$inner"; rc=$?
rm -f "$inner"
if [ $rc -eq 0 ]; then echo "bundle relocation: PASS ($(du -sh "$D" | cut -f1) at $D)"; else echo "bundle relocation: FAIL"; fi
exit $rc
