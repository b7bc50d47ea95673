"""A stand-in base interpreter for venv toolchains: answers hefbuild's probe, makes an
"environment" whose python is itself, and as that python plays `pip install -r <lock>`:
it prints what pip prints, then (when FAKE_PIP_GO names a file) waits for that file to
appear, so a test sees heartbeats of a creation still running without timing anything."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = '''#!{python}
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
if args[:1] == ["-c"]:
    print(json.dumps({{"python": "3.11.7", "implementation": "cpython",
                      "platform": "linux-x86_64", "executable": os.path.realpath(__file__)}}))
elif args[:2] == ["-m", "venv"]:
    (Path(args[2]) / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(__file__), Path(args[2]) / "bin" / "python")
    print("created", args[2], flush=True)
elif args[:3] == ["-m", "pip", "install"]:
    pins = [ln for ln in Path(args[-1]).read_text().splitlines() if "==" in ln]
    print("Collecting " + pins[0], flush=True)
    go, deadline = os.environ.get("FAKE_PIP_GO"), time.monotonic() + 120
    while go and not Path(go).exists():
        if time.monotonic() > deadline:  # a guard, never reached when the test works
            sys.exit("fake pip: nobody said go")
        time.sleep(0.01)
    print("Successfully installed " + " ".join(p.replace("==", "-") for p in pins), flush=True)
else:
    sys.exit("fake python: unexpected " + " ".join(args))
'''


def write_fake_python(path: Path) -> Path:
    """The stand-in at `path` (executable); its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT.format(python=sys.executable))
    path.chmod(0o755)
    return path
