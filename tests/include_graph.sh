#!/usr/bin/env bash
# The module include graph of sim/ and oracle/ has no cycle and no arrow against the layers
# (base -> backend -> parallel -> weights -> model -> oracle -> run -> CLIs): tools/ci/include-graph.py.
. "$(dirname "$0")/lib.sh"
exec "$PY" tools/ci/include-graph.py
