"""How every tool reads and writes its files: paths proven inside their root, writes that never follow a
symlink, inputs that must be regular files, and JSON read against a schema.

- `within(root, path)`: the path with every symlink resolved lies inside the resolved `root` (a run directory,
  a data directory); an output name such as `--prefix ../x`, or a directory inside the run that is a symlink to
  elsewhere, is refused in one line before anything is written;
- `atomic_write` / `atomic_write_text`: a temporary file created exclusively beside the target (`mkstemp`:
  O_EXCL, so never through a planted symlink), renamed over it (a rename replaces a symlink, it never writes
  through one);
- `open_append` / `open_lock`: files kept open and written in place (a run's log and metrics, its lock) are
  opened with O_NOFOLLOW and must be regular files (never a FIFO that blocks or a device);
- `read_regular`: an input read whole only when it is a regular file of at most `max_bytes` (a FIFO given as
  an artifact is refused instead of blocking forever);
- `check_schema`: a decoded JSON object's keys and value types checked before use (the project has no JSON
  schema library among its dependencies; this is the few lines its run-directory files need).

Every problem raises `UnsafeFile` (a BadInput: one line naming the file, exit 2). No JAX, no project import
but `errors`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from frontier_jax.errors import BadInput


class UnsafeFile(BadInput):
    """A path outside its root, a symlink where a file is written, a non-regular input, JSON of the wrong shape."""


def within(root, path, why: str = "refusing to write there") -> Path:
    """`path`, after proving that it lies inside `root` once every symlink (the last component's included) is
    resolved; UnsafeFile otherwise (its message ends with `why`)."""
    root, path = Path(root), Path(path)
    real_root, real = root.resolve(), path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafeFile(f"{path}: resolves to {real}, outside {root}; {why}")
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a file of another kind"


def _open(path: Path, flags: int, what: str, follow: bool = False) -> int:
    """os.open without following a symlink (unless `follow`) and without blocking on a FIFO; the descriptor
    of a regular file."""
    try:
        fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(f"{path}: {what} is a symlink; refusing to follow it (remove it)") from None
        if e.errno == errno.ENXIO:  # a FIFO without a reader, a device without its driver
            raise UnsafeFile(f"{path}: {what} is {_kind(os.stat(path).st_mode)}, not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_append(path, what: str = "the file"):
    """A text file object appending to `path` (created if absent), never through a symlink."""
    fd = _open(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, what)
    return os.fdopen(fd, "a", encoding="utf-8")


def open_lock(path, what: str = "the lock file") -> int:
    """A read-write descriptor of `path` (created if absent), never through a symlink."""
    return _open(Path(path), os.O_RDWR | os.O_CREAT, what)


def read_regular(path, what: str, max_bytes: int | None = None, follow: bool = True) -> bytes:
    """The bytes of `path` when it is a regular file of at most `max_bytes`; UnsafeFile otherwise (a FIFO or a
    device is refused, never read). follow=False: a symlink is refused too (a file of a run directory, which
    the run itself rewrites); an input's symlink is followed."""
    path = Path(path)
    fd = _open(path, os.O_RDONLY, what, follow)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise UnsafeFile(f"{path}: {what} has {size:,} bytes, over the limit of {max_bytes:,}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:  # it grew while being read
            raise UnsafeFile(f"{path}: {what} has over {max_bytes:,} bytes, the limit")
        return data
    finally:
        os.close(fd)


def check_regular(path, what: str) -> Path:
    """`path` when it is a readable regular file (symlinks followed); UnsafeFile naming what it is otherwise:
    a dangling symlink, a symlink loop, a directory, a FIFO, a device, unreadable."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UnsafeFile(f"{path}: {what} is a dangling symlink (its target does not exist)") from None
    except OSError as e:
        why = "a symlink loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise UnsafeFile(f"{path}: {what} cannot be read ({why})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file")
    if not os.access(path, os.R_OK):
        raise UnsafeFile(f"{path}: {what} is not readable (permission denied)")
    return path


def atomic_write(path, chunks, root=None) -> None:
    """Write bytes `chunks` to a temporary file created exclusively beside `path`, then rename it over `path`
    (inside `root` when given: `within`)."""
    path = Path(path)
    if root is not None:
        within(root, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the project's files are ordinary readable files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str, root=None) -> None:
    """Atomically write UTF-8 `text` to `path` (`atomic_write`)."""
    atomic_write(path, [text.encode("utf-8")], root)


# ----------------------------------------------------------------------------- JSON against a schema

NUMBER = (int, float)


def _type_name(spec) -> str:
    if isinstance(spec, dict):
        return "an object"
    if isinstance(spec, list):
        return "a list"
    types = spec if isinstance(spec, tuple) else (spec,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def check_schema(obj, schema, where: str, key: str = ""):
    """`obj` when it has the shape `schema` describes; UnsafeFile naming `where` and the key otherwise.

    A schema is a type or a tuple of types (int never matches a bool), a list `[item schema]`, or a dict
    {key: schema} of an object's keys (required unless the key ends with "?"; other keys are allowed)."""
    label = key or "the top level"
    if isinstance(schema, dict):
        if not isinstance(obj, dict):
            raise UnsafeFile(f"{where}: {label} is {type(obj).__name__}, expected an object")
        for name, sub in schema.items():
            optional = name.endswith("?")
            name = name.rstrip("?")
            if name not in obj:
                if optional:
                    continue
                raise UnsafeFile(f"{where}: missing key {key + '.' if key else ''}{name}")
            check_schema(obj[name], sub, where, f"{key}.{name}" if key else name)
        return obj
    if isinstance(schema, list):
        if not isinstance(obj, list):
            raise UnsafeFile(f"{where}: {label} is {type(obj).__name__}, expected a list")
        for i, item in enumerate(obj):
            check_schema(item, schema[0], where, f"{key}[{i}]")
        return obj
    types = schema if isinstance(schema, tuple) else (schema,)
    if (isinstance(obj, bool) and bool not in types) or not isinstance(obj, types):
        raise UnsafeFile(f"{where}: {label} is {json.dumps(obj)[:40] if _jsonable(obj) else type(obj).__name__}, "
                         f"expected {_type_name(schema)}")
    return obj


def _jsonable(obj) -> bool:
    try:
        json.dumps(obj)
        return True
    except (TypeError, ValueError):
        return False


def read_json(path, schema, what: str, max_bytes: int = 64 << 20):
    """A JSON file of a run or a tool, decoded and checked against `schema` (`check_schema`); UnsafeFile in
    one line naming the file when it is not a regular file, not JSON (a truncated write) or of another shape."""
    path = Path(path)
    raw = read_regular(path, what, max_bytes)
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnsafeFile(f"{path}: unreadable {what} ({str(e).splitlines()[0]})") from None
    return check_schema(obj, schema, f"{path}: {what}")
