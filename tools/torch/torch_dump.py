#!/usr/bin/env python3
"""torch_dump.py — kept for existing users: `from torch_dump import FluxDumper` (with tools/ on
sys.path) still works. The code lives in the installable package python/flux_dump (`pip install
./python`, then `from flux_dump import FluxDumper`); this file only makes that package importable
from a checkout and re-exports it. There is no second copy of the dumper.

Usage, the recipe, the sharding map of per-rank dumps: python/flux_dump/dumper.py's docstring and
docs/peers.md.
"""
import os
import sys

# this checkout's package first, so that the tools and the tests run the code beside them even
# when another flux_dump is installed
_here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
if os.path.isdir(os.path.join(_here, "flux_dump")) and _here not in sys.path:
    sys.path.insert(0, _here)
from flux_dump import *            # noqa: E402,F401,F403
from flux_dump import __all__      # noqa: E402,F401
from flux_dump import dumper as _dumper   # noqa: E402
from flux_dump.dumper import _tmp_name, _host_token, _remove_stale   # noqa: E402,F401

__doc__ = (__doc__ or "") + "\n" + (_dumper.__doc__ or "")
