"""dspark: DSpark speculative decoding from Python.

    import dspark
    llm = dspark.Model("smollm2")                 # GGUF path or alias; drafter="auto"
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    print(out["choices"][0]["message"]["content"], out["dspark"]["tau"])

See README.md ("Python") for the whole API.
"""

import os as _os

# The OpenMP runtime under ATen reads its wait policy once, when it is loaded:
# a short spin keeps decoding fast when other processes compete for the cores
# (the `dspark` command sets the same; see src/cli/main.cpp).
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "1000"

from ._core import DsparkError, __version__  # noqa: E402
from ._model import Model  # noqa: E402
from ._commands import bench, calibrate, cli, init_drafter, profile, sts_report  # noqa: E402

__all__ = [
    "DsparkError",
    "Model",
    "bench",
    "calibrate",
    "cli",
    "init_drafter",
    "profile",
    "sts_report",
    "__version__",
]
