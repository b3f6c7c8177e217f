#!/usr/bin/env bash
# The module include graph of sim/ and oracle/ has no cycle and no arrow against the layers
# (base -> backend -> parallel -> weights -> model -> oracle -> run -> CLIs): tools/include-graph.py.
cd "$(dirname "$0")/.."
exec python3 tools/include-graph.py
