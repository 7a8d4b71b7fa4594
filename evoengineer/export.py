"""From elite.json to something a model calls: `export` writes a self-contained, pip-installable package of one
elite; `load` returns the same callable without writing one. Both use the source recorded in elite.json (checked
against its hash), never today's template, and the family binding that refuses inputs the kernel was not compiled
for. The op itself is evoengineer/ops/runtime.py, copied into every package."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from evoengineer import elite_json
from evoengineer.candidate import sha256_text
from evoengineer.errors import UserError
from evoengineer.fileio import umask
from evoengineer.space.backend import backend_of

OPS_DIR = Path(__file__).resolve().parent / "ops"


def family_of(build: dict[str, Any], family: str | None = None, where: str = "elite",
              elite_path: str | Path | None = None, accept_family_change: bool = False) -> type:
    """The family an elite's build record names (name and version; never a path or module from the file): found
    among the shipped and installed families, or the class `family` names (module:Class, or family.py:Class
    relative to the working folder, else to the elite file's folder), which must be that family of that version.
    A family that is not shipped must also be the source the search ran (`source_sha256`), unless
    `accept_family_change`."""
    from evoengineer.families import check_version, family_class, family_source_file, family_source_sha256, find_family

    rec = build.get("family") if isinstance(build.get("family"), dict) else {}
    name, version = rec.get("name", build.get("task")), rec.get("version")
    if not isinstance(name, str):
        raise UserError(f"{where}: the build record names no family")
    if family is None:
        cls = find_family(name, version, where=where)
    else:
        file_part, _, cls_name = family.rpartition(":")
        base = Path.cwd()
        if file_part.endswith(".py") and Path(file_part).expanduser().is_absolute():  # the caller's own file
            path = Path(file_part).expanduser()
            base, family = path.parent, f"{path.name}:{cls_name}"
        elif file_part.endswith(".py") and not (base / file_part).is_file() and elite_path is not None:
            beside = Path(elite_path).resolve().parent  # relative to the elite file, where it was written
            if (beside / file_part).is_file():
                base = beside
        cls = check_version(family_class(family, base_dir=base, where="--family"), name, version, where)
    recorded = rec.get("source_sha256")
    if recorded and not accept_family_change and not is_shipped(cls):
        here = family_source_sha256(cls)
        if here != recorded:
            raise UserError(f"{where}: family {name!r} version {version} at {family_source_file(cls)} is not the "
                            f"source the kernel was searched with (sha256 {here[:12]} here, {recorded[:12]} "
                            "recorded): bump the family's version when its contract changes, or accept it "
                            "(--accept-family-change, accept_family_change=True)")
    return cls


def is_shipped(cls: type) -> bool:
    """A family that comes with EvoEngineer (its version is its contract; its source changes with releases)."""
    return cls.__module__.startswith("evoengineer.families.")


def family_instance(cls: type, build: dict[str, Any]) -> Any:
    """The family configured with an elite's recorded signature constants (no shapes: for its binding and op)."""
    return cls(constants=build["signature"], backend=build.get("backend", "cpu"))


def select_elite(path: str | Path, rank: int, family: str | None = None, accept_family_change: bool = False
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document and its elite of `rank`, checked for what a build needs; UserError naming what is missing."""
    doc = elite_json.read(path)
    elites = doc["elites"]
    if not elites:
        raise UserError(f"{path}: holds no elites (the run found no correct kernel)")
    match = [e for e in elites if e.get("rank") == rank]
    if not match:
        raise UserError(f"{path}: no elite of rank {rank} (ranks 1..{len(elites)})")
    e = match[0]
    check_buildable(e, f"{path}: elites[rank {rank}]", family, path, accept_family_change)
    return doc, e


def select_shape_elites(path: str | Path, family: str | None = None, accept_family_change: bool = False
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document and its shape_elites (the fastest correct kernel of each timed shape), each checked as
    `select_elite` checks an elite; UserError when there are none."""
    doc = elite_json.read(path)
    entries = doc.get("shape_elites")
    if not entries:
        why = ("its run found no correct kernel" if isinstance(entries, list) else
               "the space times fewer than 2 shapes, or an older EvoEngineer wrote it")
        raise UserError(f"{path}: no per-shape elites (shape_elites) to export with --per-shape: {why}; "
                        "export one elite without --per-shape")
    for e in entries:
        check_buildable(e, f"{path}: shape_elites[{e['shape']}]", family, path, accept_family_change)
        if not isinstance(e.get("shape_spec"), dict):
            raise UserError(f"{path}: shape_elites[{e['shape']}]: no shape_spec to dispatch by")
    return doc, entries


def _is_variant_group(path: str | Path) -> bool:
    from evoengineer.search.variants import is_variants_doc

    try:
        return is_variants_doc(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return False


def select_variant_entries(path: str | Path, per_shape: bool, family: str | None = None,
                           accept_family_change: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A variants file's kernels for one dispatching op: per variant its rank-1 elite (with `per_shape`, its
    shape_elites), each row's shape_spec carrying the variant's input dtypes (what a call is matched by). The
    family must declare its call (the dtypes come from it)."""
    from evoengineer.search.variants import read_group

    group, found = read_group(path)
    entries: list[dict[str, Any]] = []
    docs = []
    for row, f in found:
        if per_shape:
            doc, picked = select_shape_elites(f, family, accept_family_change)
        else:
            doc, first = select_elite(f, 1, family, accept_family_change)
            picked = [first]
        docs.append(doc)
        cls = family_of(picked[0]["build"], family, str(f), f, accept_family_change)
        try:
            dtypes = [t.dtype for t in family_instance(cls, picked[0]["build"]).signature.inputs]
        except NotImplementedError:
            raise UserError(f"{path}: family {cls.name!r} has a binding of its own (no declared call to tell the "
                            f"variants apart by): export each variant's file ({row['file']}) on its own") from None
        for e in picked:
            spec = dict(e.get("shape_spec") or {})
            entries.append({**e, "shape": f"{row['label']}/{e.get('shape', 'rank1')}",
                            "shape_spec": {**spec, "dtypes": dtypes}})
    return {"space": group["space"], "run_id": None, "variants": [r["label"] for r, _ in found],
            "docs": docs}, entries


def check_buildable(e: dict[str, Any], where: str, family: str | None = None, elite_path: str | Path | None = None,
                    accept_family_change: bool = False) -> type:
    """The entry's family class; UserError (naming `where`) unless the entry has a build record of a family found
    here and its recorded source, matching its hash, defining the family's entry point."""
    build = e.get("build")
    if not isinstance(build, dict) or not isinstance(build.get("signature"), dict):
        raise UserError(f"{where}: no build record (signature, flags, arch); written by an older EvoEngineer: "
                        "re-run or resume the search to export it")
    cls = family_of(build, family, where, elite_path, accept_family_change)
    source = e.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{where}: no recorded kernel source; refusing to rebuild from today's template")
    if e.get("source_sha256") and sha256_text(source) != e["source_sha256"]:
        raise UserError(f"{where}: the recorded source does not match its source_sha256 (edited after the search); "
                        "refusing to build it")
    entry = cls.entry
    if not re.search(rf"\b{re.escape(entry)}\s*\(", source):
        raise UserError(f"{where}: the recorded source does not define {entry}(), the entry point today's "
                        f"{cls.name} binding calls (an older kernel interface); re-run the search to export it")
    return cls


def template_drift(doc: dict[str, Any], elite: dict[str, Any]) -> str | None:
    """A note when the space's template changed since the search (the recorded source is used either way)."""
    from evoengineer.candidate import template_sha256
    from evoengineer.space import load_space

    from evoengineer.paths import space_file

    build = elite["build"]
    path = Path(doc.get("space_file") or "")
    if not path.is_file() and isinstance(doc.get("space"), str):  # a shipped space that has moved since (by name)
        path = space_file(f"{doc['space']}.toml")
    try:
        now = template_sha256(load_space(path))
    except (OSError, UserError, ValueError):
        return None
    if build.get("template_sha256") and now != build["template_sha256"]:
        return (f"template {build['template']} changed since the search ({build['template_sha256'][:12]} -> "
                f"{now[:12]}): using the source recorded in elite.json, as measured")
    return None


def _module_name(elite: dict[str, Any]) -> str:
    return re.sub(r"\W", "_", f"evo_{elite['build']['task']}_{elite['hash'][:16]}")


def write_kernel_folder(elite: dict[str, Any], folder: Path, cls: type) -> None:
    """The files KernelOp builds from: kernel.json, the recorded source, the family's binding (its own, or generated
    from its signature) with its header, the shim."""
    from evoengineer.compiler.builder import BINDING_INCLUDE
    from evoengineer.compiler.steps import shim_source
    from evoengineer.family import launched
    from evoengineer.ops.runtime import BINDING_HEADERS

    build = elite["build"]
    fam = family_instance(cls, build)
    suffix = backend_of(build["backend"]).source_suffix
    name = _module_name(elite)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"kernel{suffix}").write_text(elite["source"])
    (folder / "binding.cpp").write_text(fam.binding.text)
    for header in BINDING_HEADERS:
        shutil.copyfile(BINDING_INCLUDE / header, folder / header)
    signature = cls.signature_text(build["signature"])
    (folder / "shim.cpp").write_text(shim_source(name, cls.entry, signature))
    kernel = {"hash": elite["hash"], "module": name, "source_file": f"kernel{suffix}", "rank": elite.get("rank"),
              "space": elite.get("space"), "params": elite.get("params"), "metrics": elite.get("metrics"),
              "certified": elite.get("certified"), "source_sha256": sha256_text(elite["source"]),
              "build": {**build, "task": cls.name, "family": {"name": cls.name, "version": str(cls.version)}}}
    device_code_only = launched(fam)
    if build["backend"] == "cuda" and (getattr(cls, "device_only", False) or device_code_only):
        cubin = write_cubin(folder, kernel, signature, launched=device_code_only)
        if cubin is not None:
            kernel["cubin"] = cubin
        elif device_code_only:  # nothing but the cubin can run it
            raise UserError(f"kernel {elite['hash'][:12]}: its family launches device code, which needs nvcc here "
                            "to compile (on PATH or in CUDA_HOME)")
    (folder / "kernel.json").write_text(json.dumps(kernel, indent=2) + "\n")


def write_cubin(folder: Path, kernel: dict[str, Any], signature: str, launched: bool = False) -> dict[str, Any] | None:
    """The kernel's device code compiled to `kernel.cubin` in `folder` with the flags of the search's device-only
    builds (the same cubin the search measured), and its record for kernel.json: the file, its arch and sha256, the
    signature the family binding loads it with, and the flags that compile it again for another architecture
    (`retarget`: not for architecture-specific code such as sm_90a); `launched`: the kernel is device code only (a
    declared Launch), which nothing but the cubin runs. An unchanged kernel folder keeps its cubin
    (`evoengineer.load` writes one each time). None when no nvcc is found: the package then compiles the kernel
    with host code on first import, as before."""
    from evoengineer.compiler.gate import compile_cuda
    from evoengineer.compiler.steps import cubin_compile_flags, nvcc_path
    from evoengineer.ops.device_code import CUBIN_FILE

    build = kernel["build"]
    flags = cubin_compile_flags({"cuda_cflags": [*build.get("cuda_flags", []), "-DEVO_WITH_CUDA"],
                                 "arch": build["arch"]})
    portable = [f for f in flags if not f.startswith(_TARGET_FLAGS)]
    record = {"file": CUBIN_FILE, "arch": build["arch"], "signature": signature, "nvcc_flags": portable,
              "retarget": not str(build["arch"])[-1].isalpha(), "flags": flags, "launched": launched,
              "source_sha256": kernel["source_sha256"]}
    path = folder / CUBIN_FILE
    try:
        before = json.loads((folder / "kernel.json").read_text()).get("cubin") or {}
    except (OSError, ValueError):
        before = {}
    if path.is_file() and {k: v for k, v in before.items() if k != "sha256"} == record \
            and hashlib.sha256(path.read_bytes()).hexdigest() == before.get("sha256"):
        return before
    nvcc = nvcc_path() or shutil.which("nvcc")
    if nvcc is None:
        return None
    r = compile_cuda(folder / kernel["source_file"], path, flags=flags, nvcc=nvcc, device_only=True)
    if r["status"] != "ok":
        raise UserError(f"kernel {kernel['hash'][:12]}: its device code does not compile here: {r['reason']}")
    return {**record, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


#: nvcc flags that name the target (left out of a cubin's flags for another architecture)
_TARGET_FLAGS = ("-arch", "--gpu-architecture", "-code", "--gpu-code", "-gencode", "--generate-code")


def _copy_op_files(cls: type, pkg: Path, family: str | None) -> tuple[str, str]:
    """Copy what the exported op needs into package folder `pkg`; returns (the __init__ lines that define `_adapter`:
    kernel record -> OpAdapter, the package's dependencies). A family with an op module of its own is self-contained
    (torch only); a declared family's package imports the family: by name among the installed ones, or as
    `family` (--family) names it (a family file is copied into the package), and needs EvoEngineer."""
    import inspect

    for f in ("runtime.py", "device_code.py"):
        shutil.copyfile(OPS_DIR / f, pkg / f)
    shutil.copyfile(OPS_DIR.parent / "space" / "flags.py", pkg / "flags.py")  # the runtime checks build flags
    here = Path(inspect.getfile(cls)).resolve().parent
    if cls.op_module:
        for f in (cls.op_module, *cls.op_files):
            shutil.copyfile(here / f, pkg / Path(f).name)
        return (f"from .{Path(cls.op_module).stem} import {cls.op_class} as _Adapter\n\n\n"
                "def _adapter(kernel):\n    return _Adapter()\n"), '"torch>=2.4", "ninja"'
    version = str(cls.version)
    if family is not None and family.rpartition(":")[0].endswith(".py"):
        copied = f"evo_family_{Path(family.rpartition(':')[0]).name}"
        shutil.copyfile(Path(inspect.getfile(cls)).resolve(), pkg / copied)
        find = (f"_family = check_version(family_class({copied + ':' + cls.__name__!r}, "
                f"base_dir=Path(__file__).resolve().parent), {cls.name!r}, {version!r}, {cls.name!r})")
    elif family is not None:
        find = f"_family = check_version(family_class({family!r}), {cls.name!r}, {version!r}, {cls.name!r})"
    else:
        find = f"_family = find_family({cls.name!r}, {version!r})"
    return ("from evoengineer.families import check_version, family_class, find_family  # noqa: F401\n\n"
            f"{find}\n\n\ndef _adapter(kernel):\n    build = kernel[\"build\"]\n"
            "    return _family(constants=build[\"signature\"], backend=build[\"backend\"]).op_adapter()\n"), \
        '"torch>=2.4", "ninja", "evoengineer"'


_INIT = '''"""{summary}

Exported by EvoEngineer from {source_name} (rank {rank}, kernel {hash12}). Built on first import through
torch.utils.cpp_extension, or with kernel.cubin only its family binding (cached in $EVOENGINEER_EXPORT_CACHE,
default ~/.cache/evoengineer/ops).

    from {package} import {function}
"""

from pathlib import Path

from .runtime import KernelOp
{adapter}
#: The kernel as registered torch.library ops (`kernel.op`, `kernel.backward_op`), with its elite record
#: (`kernel.kernel`) and signature (`kernel.signature`).
kernel = KernelOp(Path(__file__).resolve().parent, adapter=_adapter)
{function} = kernel.function


def with_fallback():
    """The same function, computing inputs outside the compiled signature with the PyTorch reference (warned once)
    instead of raising."""
    return KernelOp(Path(__file__).resolve().parent, adapter=_adapter, fallback="reference").function


__all__ = ["{function}", "kernel", "with_fallback"]
'''

_PYPROJECT = '''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{summary}"
requires-python = ">=3.10"
dependencies = [{dependencies}]

[tool.setuptools]
packages = ["{package}"]

[tool.setuptools.package-data]
"{package}" = ["*.cu", "*.cpp", "*.h", "*.json", "*.cubin"{data}]
'''

_INIT_PER_SHAPE = '''"""{summary}

Exported by EvoEngineer from {source_name} (shape_elites: {n} kernel(s)). Each call runs the kernel whose timed shape is
nearest to its inputs (`kernel.table`, dispatch.json); a kernel is built when a call first needs it, through
torch.utils.cpp_extension (cached in $EVOENGINEER_EXPORT_CACHE, default ~/.cache/evoengineer/ops).

    from {package} import {function}
"""

from pathlib import Path

from .runtime import ShapeDispatch
{adapter}
#: The kernels by shape (`kernel.table`), the row a call would use (`kernel.choose(...)`), the kernels built so far
#: (`kernel.ops`, KernelOps by hash) and the calls each ran (`kernel.calls`).
kernel = ShapeDispatch.from_file(Path(__file__).resolve().parent / "dispatch.json", adapter=_adapter)
{function} = kernel.function


def with_fallback():
    """The same function, computing inputs outside the compiled signature with the PyTorch reference (warned once)
    instead of raising."""
    return ShapeDispatch.from_file(Path(__file__).resolve().parent / "dispatch.json", adapter=_adapter,
                                   fallback="reference").function


__all__ = ["{function}", "kernel", "with_fallback"]
'''

_README_PER_SHAPE = ("\nSeveral kernels (one folder each, `kernel-<hash>/`), each the fastest of its search on one "
                     "timed shape: every call runs the one whose recorded shape (dispatch.json) is nearest to its "
                     "inputs (sizes compared on a log scale, among the recorded shapes of the call's kind when the "
                     "family tells kinds apart). `kernel.build()` builds them all now (before torch.compile or CUDA graph "
                     "capture).\n")


def write_kernels(entries: list[dict[str, Any]], folder_of: Callable[[dict[str, Any]], Path],
                  cls: type) -> list[dict[str, Any]]:
    """A kernel folder (`write_kernel_folder`, at `folder_of(entry)`) per distinct kernel of shape_elites `entries`,
    and ShapeDispatch's table: one row per shape."""
    rows, written = [], set()
    for e in entries:
        folder = folder_of(e)
        if e["hash"] not in written:
            write_kernel_folder(e, folder, cls)
            written.add(e["hash"])
        rows.append({"shape": e["shape"], "shape_spec": e["shape_spec"], "hash": e["hash"], "p50_us": e.get("p50_us"),
                     "objective_us": e.get("objective_us"), "rank": e.get("rank"), "folder": folder})
    return rows


def export(path: str | Path, out: str | Path, *, rank: int = 1, force: bool = False,
           per_shape: bool = False, family: str | None = None,
           accept_family_change: bool = False) -> tuple[Path, str, list[str]]:
    """Write elite `rank` of `path` as a package folder `out`: returns (folder, package name, notes). With
    `per_shape`, the kernels of its shape_elites instead (`rank` unused): the function runs, per call, the one whose
    timed shape is nearest to the inputs (runtime.ShapeDispatch; the table in dispatch.json). `family`: where the
    elite's family is (module:Class or family.py:Class) when it is not shipped or installed. The folder appears
    whole or not at all; an existing one is replaced only with `force`."""
    group = _is_variant_group(path)
    if group:  # one op over the variants' kernels, dispatched by the inputs' dtypes (and shape with per_shape)
        doc, entries = select_variant_entries(path, per_shape, family, accept_family_change)
        e = entries[0]
        per_shape = True
    elif per_shape:
        doc, entries = select_shape_elites(path, family, accept_family_change)
        e = entries[0]
    else:
        doc, e = select_elite(path, rank, family, accept_family_change)
    cls = family_of(e["build"], family, str(path), path, accept_family_change)
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not force:
        raise UserError(f"--out {out}: exists and is not empty (--force replaces it)")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file")
    notes = [n for n in [template_drift(doc, e)] if n] if not group else \
        [n for d in doc["docs"] for n in [template_drift(d, d["elites"][0])] if n]
    task = cls.name
    function = cls.function
    where = f"{e['build']['backend']}{'/' + e['build']['arch'] if e['build'].get('arch') else ''}"
    if per_shape:
        hashes = list(dict.fromkeys(x["hash"] for x in entries))
        package = re.sub(r"\W", "_", f"evo_{doc['space']}_{'variants' if group else 'shapes'}_"
                                      f"{sha256_text(' '.join(hashes))[:10]}").lower()
        summary = (f"{doc['space']}: {len(hashes)} {task} kernel(s), the fastest of its search on each of "
                   f"{len(entries)} timed shapes ({', '.join(x['shape'] for x in entries)}), dispatched by shape, "
                   f"{where}") if not group else (
            f"{doc['space']}: {len(hashes)} {task} kernel(s) of {len(doc['variants'])} signature variants "
            f"({', '.join(doc['variants'])}), dispatched by the inputs' dtypes, {where}")
    else:
        package = re.sub(r"\W", "_", f"evo_{doc['space']}_{e['hash'][:10]}").lower()
        summary = (f"{doc['space']} elite {rank}: {task} kernel {e['hash'][:12]} "
                   f"({e.get('metrics', {}).get('time_us', 0):.1f} us p50"
                   f"{' re-timed' if 'search_time_us' in e.get('metrics', {}) else ' in its search'}, {where})")
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())
        pkg = tmp / package
        pkg.mkdir()
        adapter, dependencies = _copy_op_files(cls, pkg, family)
        if per_shape:
            # "kernel-": not a Python identifier, so setuptools takes the folders as data, not as packages
            rows = write_kernels(entries, lambda x: pkg / f"kernel-{x['hash'][:16]}", cls)
            table = {"task": task, "function": function, "space": doc["space"], "run_id": doc["run_id"],
                     "source": Path(path).name,
                     "kernels": [dict(r, folder=r["folder"].name) for r in rows]}
            (pkg / "dispatch.json").write_text(json.dumps(table, indent=2) + "\n")
            init = _INIT_PER_SHAPE.format(summary=summary, source_name=Path(path).name, n=len(hashes),
                                          package=package, function=function, adapter=adapter)
        else:
            write_kernel_folder(e, pkg, cls)
            init = _INIT.format(summary=summary, source_name=Path(path).name, rank=rank, hash12=e["hash"][:12],
                                package=package, function=function, adapter=adapter)
        (pkg / "__init__.py").write_text(init)
        (tmp / "pyproject.toml").write_text(_PYPROJECT.format(
            dist=package.replace("_", "-"), summary=summary, package=package, dependencies=dependencies,
            data=', "kernel-*/*"' if per_shape else ""))
        compiles = "Each kernel compiles when a call first needs it" if per_shape else \
            "The kernel compiles on first import"
        if any(pkg.rglob("kernel.cubin")):
            compiles = ("The kernel's device code comes compiled (kernel.cubin, for "
                        f"{e['build']['arch']}; for another GPU it is compiled again, device code only): on first "
                        "import only the family's launcher compiles, once per toolchain")
        (tmp / "README.md").write_text(
            f"# {package}\n\n{summary}.\n\n```python\nfrom {package} import {function}\n```\n\n"
            f"`pip install .` here, or put this folder on PYTHONPATH. {compiles} "
            "(torch.utils.cpp_extension, cached). Inputs outside the compiled signature (kernel.json, "
            "`build.signature`) raise ValueError/TypeError; `with_fallback()` gives a function that computes them "
            "with the PyTorch reference instead. Forward is the searched kernel; the backward is the reference's.\n"
            + (_README_PER_SHAPE if per_shape else ""))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, package, notes


def load(path: str | Path, rank: int = 1, *, fallback: str | None = None,
         build_root: str | Path | None = None, per_shape: bool = False,
         family: str | None = None, accept_family_change: bool = False) -> Callable[..., Any]:
    """Elite `rank` of an elite.json as the function an exported package exposes (the family's function: its own
    op adapter's, or a declared family's `function(*inputs, *scalars)`), built from the recorded
    source on first use (cached). `family`: where the elite's family is (module:Class or family.py:Class) when it is
    not shipped or installed (a relative family.py path: from the working folder, else the elite file's);
    `accept_family_change`: run it through a family whose source differs from the one the search recorded. The
    function carries `.kernel` (the KernelOp: ops, signature, elite record). With
    `per_shape`, the kernels of its shape_elites (`rank` unused), dispatched by shape: `.kernel` is the
    ShapeDispatch (`table`, `choose`), each kernel built when a call first needs it."""
    from evoengineer.ops.runtime import KernelOp, ShapeDispatch, default_build_root

    group = _is_variant_group(path)
    if group:  # the variants' kernels, dispatched by the inputs' dtypes
        doc, entries = select_variant_entries(path, per_shape, family, accept_family_change)
        e = entries[0]
        per_shape = True
    elif per_shape:
        doc, entries = select_shape_elites(path, family, accept_family_change)
        e = entries[0]
    else:
        doc, e = select_elite(path, rank, family, accept_family_change)
    cls = family_of(e["build"], family, str(path), path, accept_family_change)
    for d, x in ([(d, d["elites"][0]) for d in doc["docs"]] if group else [(doc, e)]):
        note = template_drift(d, x)
        if note:
            print(f"evoengineer.load: {note}", file=sys.stderr)

    def adapter(kernel: dict[str, Any]) -> Any:
        return family_instance(cls, kernel["build"]).op_adapter()

    root = Path(build_root) if build_root else default_build_root()
    if per_shape:
        rows = write_kernels(entries, lambda x: root / "sources" / _module_name(x), cls)
        op: Any = ShapeDispatch(rows, adapter=adapter, fallback=fallback, build_root=root)
    else:
        folder = root / "sources" / _module_name(e)
        write_kernel_folder(e, folder, cls)
        op = KernelOp(folder, adapter=adapter, fallback=fallback, build_root=root)
    fn = op.function

    def function(*args, **kwargs):
        return fn(*args, **kwargs)

    function.__doc__ = fn.__doc__
    function.__name__ = cls.function
    function.kernel = op  # type: ignore[attr-defined]
    return function
