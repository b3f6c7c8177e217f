#!/usr/bin/env bash
# The module include graph of sim/ and oracle/ has no cycle and no arrow against the layers
# (base -> backend -> parallel -> weights -> model -> oracle -> run -> CLIs): tools/include-graph.py.
. "$(dirname "$0")/lib.sh"
exec "$PY" tools/include-graph.py
