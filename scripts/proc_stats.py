"""Figures shared by the serving scripts (load_serve.py, soak.py): a
process's resident memory and nearest-rank percentiles. Standard library
only."""

import math


def rss_mib(pid):
    """Resident memory of a process in MiB (None when unknown)."""
    if not pid:
        return None
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def percentile(values, q):
    """Nearest-rank q-quantile, q in (0, 1] (None for no values)."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]
