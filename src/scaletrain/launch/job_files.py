"""What a submitted job's config names on this machine, and how each file reaches the job (#60).

``submit`` uploads the working directory as the job's ``working_dir``, and Ray leaves out what its default
excludes, scaletrain's ``EXCLUDES``, ``.rayignore`` and ``.gitignore`` files name. Data usually sits in an
ignored folder, so a job could be submitted, queued and started only to fail on the cluster with "file not found".
Before anything is uploaded, every local file the config names is checked the way Ray will package it (its own
rules, simulated with the same ``pathspec`` matcher Ray uses): one that ``.gitignore`` alone leaves out is
uploaded all the same (Ray is told to read no ``.gitignore`` and is given their patterns as excludes, with the
named files taken back out of them); one that no rule change can bring (an exclude of scaletrain's or Ray's, a
``.rayignore``, a relative path outside the working directory, more than Ray's package limit) is refused in one
line naming the file and the fix; an absolute path outside it is read at that path on the cluster, and said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pathspec import PathSpec

from scaletrain.config.schema import Config
from scaletrain.errors import ConfigError

RAY_DEFAULT_EXCLUDES = (".git", ".venv", "venv", "__pycache__")  # ray_constants.RAY_RUNTIME_ENV_DEFAULT_EXCLUDES
PACKAGE_LIMIT_BYTES = 512 * 1024 * 1024  # Ray's package limit: its gRPC message size (RAY_max_grpc_message_size)


@dataclass(frozen=True)
class Named:
    key: str  # the config key that names it: data.train_file, model.name_or_path, ...
    path: Path  # where it is on this machine


@dataclass
class Upload:
    """How the job gets its files: Ray's excludes, whether Ray reads .gitignore files, and what to say."""

    excludes: list[str]
    read_gitignore: bool = True
    notes: list[str] = field(default_factory=list)


def named_files(cfg: Config) -> list[Named]:
    """The local files and folders the config names (object-storage URIs and built-ins are not local)."""
    d, out = cfg.data, []
    candidates = [("data.train_file", d.train_file), ("data.eval_file", d.eval_file),
                  ("data.dataset_dir", d.dataset_dir), ("model.name_or_path", cfg.model.name_or_path),
                  ("comm.profile", cfg.comm.profile)]
    if d.template.endswith(".jinja") or "/" in d.template:
        candidates.append(("data.template", d.template))
    for key, value in candidates:
        if not value or "://" in value or value.startswith("builtin:"):
            continue
        path = Path(value).expanduser()
        if key in ("model.name_or_path", "comm.profile") and not path.exists():
            continue  # a hub id (refused by train itself) or a shipped profile's name
        out.append(Named(key, path))
    return out


def plan_upload(cfg: Config, working_dir: Path, excludes: list[str], limit: int = PACKAGE_LIMIT_BYTES) -> Upload:
    """How the job gets every file the config names (local paths as written: relative ones are read from the job's
    working directory), or a ConfigError naming the first that cannot reach it."""
    working_dir = working_dir.resolve()
    upload, inside = Upload(list(excludes)), []
    for named in named_files(cfg):
        # the job runs in its working directory: a relative path is read from there on the cluster
        path = (named.path if named.path.is_absolute() else working_dir / named.path).resolve()
        try:
            rel = path.relative_to(working_dir).as_posix()
        except ValueError:
            if not named.path.is_absolute():
                raise ConfigError(f"{named.key}={named.path}: outside the working directory {working_dir}, so it "
                                  f"is not uploaded with the job; move it inside, or give a path on shared storage "
                                  f"(absolute) or object storage (s3://...)") from None
            upload.notes.append(f"{named.key}={path}: outside the working directory, not uploaded: the job reads it "
                                f"at that path on the cluster (it must be on storage every node sees)")
            continue
        if not path.exists():
            raise ConfigError(f"{named.key}={named.path}: not found in the working directory {working_dir}, where "
                              f"the job reads it; give its path relative to {working_dir}")
        inside.append((named, rel, path))
    if not inside:
        return upload
    size = sum(_size(path) for _, _, path in inside)
    if size > limit:
        named = max(inside, key=lambda n: _size(n[2]))[0]
        raise ConfigError(f"{named.key}={named.path}: the files the config names are {size / 2**20:.0f} MiB, over "
                          f"Ray's package limit of {limit / 2**20:.0f} MiB for a job's working directory; put the "
                          f"data on shared storage (an absolute path) or object storage (s3://...) and name that")
    rules = RayRules(working_dir, [*RAY_DEFAULT_EXCLUDES, *excludes])
    blocked = [(named, rel, why) for named, rel, _ in inside if (why := rules.left_out(rel))]
    if not blocked:
        return upload
    for named, _, why in blocked:
        if ".gitignore matches" not in why:
            raise ConfigError(f"{named.key}={named.path}: Ray would not upload it with the job ({why}); move it out "
                              f"of that rule's reach, or give a path on shared or object storage (s3://...)")
    patterns = rules.gitignore_patterns(taking_back=[rel for _, rel, _ in blocked])
    retried = RayRules(working_dir, [*RAY_DEFAULT_EXCLUDES, *excludes, *patterns], read_gitignore=False)
    for named, rel, why in blocked:
        if still := retried.left_out(rel):
            raise ConfigError(f"{named.key}={named.path}: Ray would not upload it with the job ({why}; without the "
                              f".gitignore files: {still}); move it, or give a path on shared or object storage")
    upload.excludes += patterns
    upload.read_gitignore = False
    upload.notes.append(f"{', '.join(f'{n.key}={rel}' for n, rel, _ in blocked)}: ignored by .gitignore, uploaded "
                        f"with the job all the same (Ray is given the .gitignore patterns less "
                        f"{'this file' if len(blocked) == 1 else 'these files'})")
    return upload


def _spec(lines) -> PathSpec:
    """Ray's matcher (gitwildmatch: the same answers as Ray's packaging), without pathspec 1.x's deprecation note
    for that name on every call."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return PathSpec.from_lines("gitwildmatch", list(lines))


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class RayRules:
    """Ray's packaging decision for one path of the working directory (ray/_private/runtime_env/packaging.py
    ``_dir_travel``): walking down from the root, a path is left out when an exclude, or a ``.gitignore`` /
    ``.rayignore`` of a folder above it, matches it or a folder on its way."""

    def __init__(self, root: Path, excludes: list[str], read_gitignore: bool = True):
        self.root, self.read_gitignore = root, read_gitignore
        self.excludes = _spec(excludes)

    def left_out(self, rel: str) -> str:
        """Why Ray would leave ``rel`` out ("" when it uploads it)."""
        parts = rel.split("/")
        ignores: list[tuple[str, Path, PathSpec]] = []
        for depth in range(len(parts)):
            folder = self.root.joinpath(*parts[:depth])
            for name in ((".gitignore", ".rayignore") if self.read_gitignore else (".rayignore",)):
                if (folder / name).is_file():
                    spec = _spec((folder / name).read_text().splitlines())
                    ignores.append((name, folder, spec))
            step = "/".join(parts[:depth + 1])
            if self.excludes.match_file(step):
                return f"an exclude of scaletrain's or Ray's matches {step}"
            for name, folder, spec in sorted(ignores, key=lambda i: i[0] == ".gitignore"):  # a .rayignore first
                below = (self.root / step).relative_to(folder).as_posix()
                if spec.match_file(below):
                    where = (folder / name).relative_to(self.root).as_posix()
                    return f"{where} matches {step}"
        return ""

    def gitignore_patterns(self, taking_back: list[str]) -> list[str]:
        """Every .gitignore of the working directory as excludes relative to its root (what Ray reads from them
        when it reads them), with the patterns that match a folder on the way to a file of ``taking_back`` narrowed
        to that folder's contents and the file itself taken back out."""
        ancestors = {"/".join(r.split("/")[:i]) for r in taking_back for i in range(1, r.count("/") + 1)}
        out = []
        for ignore in sorted(self.root.rglob(".gitignore")):
            if any(p in RAY_DEFAULT_EXCLUDES for p in ignore.relative_to(self.root).parts[:-1]):
                continue
            base = ignore.parent.relative_to(self.root).as_posix()
            for line in ignore.read_text().splitlines():
                pattern = _rooted(line.strip(), "" if base == "." else base)
                if not pattern:
                    continue
                if not pattern.startswith("!") and any(_spec([pattern]).match_file(a)
                                                       for a in ancestors):
                    pattern = pattern.rstrip("/") + "/**"  # the folder's contents, not the folder: Ray walks into it
                out.append(pattern)
        return out + [f"!{r}" for r in taking_back] + [f"!{r}/**" for r in taking_back
                                                         if (self.root / r).is_dir()]


def _rooted(line: str, base: str) -> str:
    """A .gitignore line of the folder ``base`` as a pattern relative to the working directory's root."""
    if not line or line.startswith("#"):
        return ""
    neg, body = ("!", line[1:]) if line.startswith("!") else ("", line)
    if not base:
        return neg + body
    if body.startswith("/"):
        return f"{neg}{base}{body}"
    if "/" in body.rstrip("/"):
        return f"{neg}{base}/{body}"
    return f"{neg}{base}/**/{body}"


def working_dir_env(upload: Upload) -> dict[str, str]:
    """The variables the submitting process sets while Ray packages the working directory."""
    from scaletrain import envvars

    return {} if upload.read_gitignore else {envvars.RAY_RUNTIME_ENV_IGNORE_GITIGNORE: "1"}
