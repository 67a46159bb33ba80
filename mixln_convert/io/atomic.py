"""Atomic files and folders: an output appears complete or not at all, with the user's umask.

A command writes into a hidden ``.DST.tmp-*`` folder renamed into place at the very end; one a killed run
left is removed by the next run to DST. Imports neither torch nor transformers (tokenizing workers use it).
"""

import errno
import os
import re
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import MixLNError
from .paths import check_destination, check_not_input

try:
    import fcntl
except ImportError:  # Windows: no flock, so temporary folders left by killed runs stay
    fcntl = None


def try_lock(folder: Path, wait: bool = False) -> int | None:
    """An exclusive lock on ``folder`` (``wait``: once no other process holds it), held until the returned
    descriptor is closed or the process dies (the kernel drops it even on SIGKILL); None if another process
    holds it, the folder is gone, or this system has no such locks."""
    if fcntl is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return fd
    except OSError:
        os.close(fd)
        if wait:
            raise
        return None


def wait_for_lock(folder: Path) -> None:
    """Block until no process holds ``folder``'s lock (:func:`try_lock`)."""
    fd = try_lock(folder, wait=True)
    if fd is not None:
        os.close(fd)


LOCK_SUFFIX = ".lock"
HOLDER = "another mixln-convert run"  # how a lock file's content starts: the refusal of a second run quotes it
LOCK_MAX = 4096  # bytes: a holder line is ~100; a larger file is no lock


@contextmanager
def hold(dst: Path, what: str, kind: str, protect=None):
    """``dst`` (an output folder or file) held by this process for the block: an exclusive OS lock on
    ``.NAME.lock`` beside it, which the kernel drops when the process dies, however it dies. While another
    process holds it, an error at once naming ``what`` and that process. The lock file is never an input
    (``protect``), a symlink or another file. Without OS locks (Windows) the block runs unguarded."""
    if fcntl is None:
        yield
        return
    lock_file = dst.with_name(f".{dst.name}{LOCK_SUFFIX}")
    check_not_input(lock_file, protect or {}, f"{what}: its lock file")
    with parents_made(dst):
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            fd = _locked(lock_file, what)
        except OSError as e:
            raise MixLNError(f"{what}: cannot lock it ({lock_file}: {e.strerror})") from None
        if fd is None:
            holder = _holder(lock_file)
            raise MixLNError(f"{what}: in use by {holder[:200]}; one run writes a folder at a time: wait for it "
                             "to end, or choose another folder")
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{HOLDER} (pid {os.getpid()} on {os.uname().nodename}: {kind})".encode())
            yield
        finally:
            try:
                if _same_file(fd, lock_file):  # while still held: a process that opened it meanwhile sees it
                    os.unlink(lock_file)  # gone and retries
            except OSError:
                pass
            os.close(fd)


@contextmanager
def parents_made(dst: Path):
    """For the block: the folders above ``dst`` that do not exist yet (the block makes them) are removed
    again if it fails, deepest first, each while empty (a run beside this one may have written there)."""
    missing = [folder for folder in dst.parents if not folder.exists()]
    try:
        yield
    except BaseException:
        for folder in missing:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, as it wrote there: it writes just after it locks, so an empty file is read
    again for up to a second before the answer is "another process"."""
    for _ in range(20):
        try:
            fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                holder = os.read(fd, LOCK_MAX).decode(errors="replace").strip()
            finally:
                os.close(fd)
        except OSError:
            holder = ""
        if holder:
            return holder
        time.sleep(0.05)
    return "another process"


def _locked(lock_file: Path, what: str) -> int | None:
    """A descriptor of ``lock_file`` holding its exclusive lock, or None while another process holds it: a new
    file made here (never through a symlink), else an existing lock (empty, or a holder's line: one a killed
    run left is taken over). A file unlinked by its last holder between our open and our lock is opened anew."""
    while True:
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666 & ~_umask())
        except FileExistsError:
            try:  # non-blocking: a FIFO opens at once, to be refused below
                fd = os.open(lock_file, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise MixLNError(f"{what}: its lock file {lock_file} is a symlink; remove it or choose another "
                                     "folder") from None
                raise
            if not _is_lock(fd):
                os.close(fd)
                raise MixLNError(f"{what}: its lock file {lock_file} exists and is not a mixln-convert lock; remove "
                                 "it or choose another folder")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock_file):
            return fd
        os.close(fd)


def _is_lock(fd: int) -> bool:
    """Whether the open file ``fd`` is a lock file: regular, and empty (its maker has not written yet) or a
    holder's line."""
    info = os.fstat(fd)
    return stat.S_ISREG(info.st_mode) and info.st_size <= LOCK_MAX and (
        info.st_size == 0 or os.pread(fd, len(HOLDER), 0) == HOLDER.encode())


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` (not followed) is still the file open as ``fd``."""
    try:
        found, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output_dir(dst, force: bool = False, protect=None):
    """Yield a temporary folder that becomes ``dst`` when the block succeeds; refuses a non-empty ``dst``
    unless ``force``, one of the ``protect`` inputs ({what: path}), and one another process is writing."""
    given = dst
    dst = check_destination(dst, protect or {}, force)
    with hold(dst, str(given), f"writing {dst.name}", protect), scratch_dir(dst) as tmp:
        check_destination(dst, protect or {}, force)  # again, held: a run that ended meanwhile may have filled it
        try:
            yield tmp
            replace_dir(tmp, dst)
        except OSError as e:
            raise MixLNError(write_failure(dst, e, tmp)) from None


@contextmanager
def atomic_output_file(dst: Path, what: str, check, protect=None):
    """Yield a temporary path beside the file ``dst`` that replaces it in one step when the block succeeds, as
    :func:`atomic_output_dir` does a folder; ``check()`` (its destination checks) runs again once it is held."""
    with hold(dst, what, f"writing {dst.name}", protect), scratch_dir(dst) as tmp:
        check()
        try:
            yield tmp / dst.name
            os.replace(tmp / dst.name, dst)
        except OSError as e:
            raise MixLNError(write_failure(dst, e, tmp)) from None


def replace_dir(tmp: Path, dst: Path) -> None:
    """Rename the complete folder ``tmp`` to ``dst``, an old ``dst`` moved aside first (no reader sees half of each)."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old)
    else:
        tmp.rename(dst)


@contextmanager
def scratch_dir(dst: Path):
    """A temporary folder beside ``dst`` (``.DST.tmp-*``, the user's umask: mkdtemp alone gives 0700), locked
    while this process lives and removed when the block ends. Those of killed runs (their lock died with
    them) are removed first: a half-written model may fill the disk."""
    with parents_made(dst):
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
            os.chmod(tmp, 0o777 & ~_umask())
        except OSError as e:
            raise MixLNError(f"{dst}: cannot write the output folder ({e.strerror})") from None
        lock = try_lock(tmp)  # marks tmp as alive before looking for dead ones
        try:
            if lock is not None:  # a run to the same DST that is still going holds its lock: left alone
                for folder in dst.parent.iterdir():
                    if folder.name.startswith(f".{dst.name}.tmp-") and (fd := try_lock(folder)) is not None:
                        shutil.rmtree(folder, ignore_errors=True)
                        os.close(fd)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left to remove once renamed into place
            if lock is not None:
                os.close(lock)


def write_failure(dst: Path, error: OSError, tmp: Path | None = None, kept: bool = False) -> str:
    """The one-line message of an OSError met while writing ``dst``: what failed and, for a full
    disk, how much the output had taken when it stopped; ``kept``: ``tmp`` stays for a rerun to resume."""
    where = f" ({error.filename})" if error.filename else ""
    message = f"{dst}: writing the output failed: {error.strerror or error}{where}"
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    # numpy's tofile (gguf-py's writer) reports a short write with no errno: named, and a full disk if it is one
    short = re.fullmatch(r"(\d+) requested and (\d+) written", str(error)) if error.errno is None else None
    if short:
        requested, done = int(short[1]), int(short[2])
        message = f"{dst}: writing the output failed: a short write ({done:,} of {requested:,} bytes written)"
        full = shutil.disk_usage(dst.parent).free < requested - done
    if full and tmp is not None and tmp.is_dir():
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        if kept:
            message += (f"; the {written / 2**20:,.1f} MiB written are kept in {tmp}: free space and run again to "
                        "resume, or remove it")
        else:
            message += f"; {written / 2**20:,.1f} MiB were written before the disk filled, free space and run again"
    return message


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace the file ``path`` with ``text`` (or bytes) in one step: a reader sees the old or the new file."""
    path = Path(path)
    mode = "wb" if isinstance(text, bytes) else "w"
    try:
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            try:
                tmp.write(text)
                tmp.flush()  # a full disk fails here, inside the try, not in a close the caller cannot place
            except BaseException:
                tmp.close()
                os.unlink(tmp.name)  # no half-written temporary file left beside ``path``
                raise
        os.chmod(tmp.name, 0o666 & ~_umask())
        os.replace(tmp.name, path)
    except OSError as e:  # named: a full disk's error says which file it stopped
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
