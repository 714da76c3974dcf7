"""scikit-build-core's dynamic metadata for mixtrain: the version and the torch requirement.

A torch extension only loads beside the torch it was compiled against (another minor
version breaks its symbols), so the wheel says which one: its version gets that torch as a
local label (0.2.0+torch2.13.0.cpu, or ...cu130), and it requires exactly that torch. The
torch is the one the building Python imports, which is why pip must run with
--no-build-isolation."""

import re
from pathlib import Path


def _torch():
    try:
        import torch
    except ImportError as e:  # one line, not a traceback from inside the backend
        raise RuntimeError("mixtrain builds against the torch this Python imports, and it has none (%s): "
                           "pip install torch first, then pip install --no-build-isolation ." % e) from None
    version = torch.__version__.split("+")[0]
    build = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    return version, build


def _project_version():
    text = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    return re.search(r"project\(mixtrain VERSION ([0-9.]+)", text).group(1)


def dynamic_metadata(settings, project):
    version, build = _torch()
    return {"version": "%s+torch%s.%s" % (_project_version(), version, build),
            "dependencies": ["torch==%s" % version]}
