"""Build flags a space file may ask for: one token each, of a known shape, with no shell metacharacters.

torch.utils.cpp_extension writes the flags into a build.ninja file and ninja runs every command through /bin/sh, so
a flag such as "-DX=1;touch /tmp/x;true" would run a command. A space file may come from a colleague or from the
internet: every flag of [build] flags / cuda_flags / ldflags must be one token made of the characters in SAFE_CHARS
and of one of the shapes below (host compiler, nvcc and linker-driver flags alike); anything else is refused when
the space is loaded (and again before a build).
"""

from __future__ import annotations

import re

#: The only characters a flag may contain: no whitespace, quotes, backslash, ; | & ` $ ( ) < > * ? [ ] { } ~ # ! @ ^.
SAFE_CHARS = "A-Za-z0-9_.,=+:/-"
_SAFE = re.compile(f"[{SAFE_CHARS}]+")
#: a CUDA target (sm_90, sm_90a): it reaches nvcc and TORCH_CUDA_ARCH_LIST
ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_WORD = r"[A-Za-z0-9][A-Za-z0-9_.+=-]*"  # an option word: -f<WORD>, -m<WORD>, -W<WORD>
_PATH = rf"[{SAFE_CHARS}]+"
_ITEM = r"[A-Za-z0-9_.+=:/-]+"  # one comma-separated item of -Wl,... / -Xptxas=...

_SHAPES: list[tuple[str, str]] = [
    (rf"-D{_NAME}(=[{SAFE_CHARS}]*)?", "-DNAME[=VALUE]"),
    (rf"-U{_NAME}", "-UNAME"),
    (rf"-I{_PATH}", "-IPATH"),
    (rf"-isystem{_PATH}", "-isystemPATH"),
    (rf"-L{_PATH}", "-LPATH"),
    (r"-l[A-Za-z0-9_.+:-]+", "-lNAME"),
    (r"-O[0-3sgz]?|-Ofast", "-O0..3/-Os/-Ofast"),
    (rf"-f{_WORD}", "-f..."),
    (rf"-m{_WORD}", "-m... (e.g. -march=native)"),
    (r"-g[0-3]?|-ggdb[0-3]?|-G|-lineinfo|--generate-line-info", "-g/-G/-lineinfo"),
    (r"-w|-pedantic|-pthread|-rdynamic|-static-libgcc|-static-libstdc\+\+|-shared-libgcc", "-pthread etc."),
    (rf"-W{_WORD}", "-W... (warnings)"),
    (rf"-W[la],{_ITEM}(,{_ITEM})*", "-Wl,... / -Wa,..."),
    (r"--?std=[A-Za-z0-9+]+", "-std=..."),
    (r"(-arch|--gpu-architecture|-code|--gpu-code)=[A-Za-z0-9_,]+", "-arch=..."),
    (r"(-gencode|--generate-code)=arch=[A-Za-z0-9_]+,code=[A-Za-z0-9_]+", "-gencode=arch=...,code=..."),
    (r"-X(compiler|ptxas|nvlink|linker|cudafe|fatbin|archive)=" + rf"{_ITEM}(,{_ITEM})*", "-Xtool=..."),
    (r"--(compiler|ptxas|linker|nvlink|archive)-options=" + rf"{_ITEM}(,{_ITEM})*", "--tool-options=..."),
    (r"--?use_fast_math|--?expt-relaxed-constexpr|--?expt-extended-lambda|--?extended-lambda",
     "--use_fast_math etc."),
    (r"--?maxrregcount=[0-9]+", "-maxrregcount=N"),
    (r"(--?ftz|--?prec-div|--?prec-sqrt|--?fmad|-rdc|--relocatable-device-code|--restrict|--?extra-device-vectorization)"
     r"(=(true|false))?", "-ftz=true etc."),
    (r"--?(res-usage|resource-usage|Wno-deprecated-gpu-targets|Wreorder|Werror=[A-Za-z0-9,-]+)", "-res-usage etc."),
    (r"--?(diag-suppress|diag_suppress|diag-warn|diag-error)=[A-Za-z0-9_,]+", "-diag-suppress=..."),
    (r"--?(default-stream)=(legacy|null|per-thread)", "--default-stream=..."),
    (r"(-t|--threads)=[0-9]+", "--threads=N"),
]
_COMPILED = [(re.compile(rx), shape) for rx, shape in _SHAPES]
SHAPES = ", ".join(shape for _, shape in _SHAPES)

# Items that load code into the compiler or linker (plugins), swap its parts (-B, -specs, -wrapper) or read options
# from a file (@FILE): refused inside -Wl,... / -Xtool=... lists, and as -f... flags.
_DANGEROUS = re.compile(r"@|-*(f?plugin|fpass-plugin|load|specs|wrapper|B(?!static|dynamic|symbolic))", re.IGNORECASE)
_HOST_LIST = re.compile(r"(-Xcompiler=|--compiler-options=)(.*)")
_TOOL_LIST = re.compile(r"(-W[la],|-X[a-z]+=|--[a-z]+-options=)(.*)")

_DESCRIBE = {" ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a carriage return", ";": "';'", "|": "'|'",
             "&": "'&'", "`": "'`'", "$": "'$'", "(": "'('", ")": "')'", "<": "'<'", ">": "'>'", "'": "a quote",
             '"': "a quote", "\\": "a backslash"}


def flag_problem(flag: object) -> str | None:
    """Why `flag` is refused as a build flag, or None when it is one allowed token."""
    if not isinstance(flag, str):
        return "a flag must be a string"
    if not flag:
        return "an empty flag"
    if not _SAFE.fullmatch(flag):
        bad = next(c for c in flag if not re.fullmatch(f"[{SAFE_CHARS}]", c))
        what = _DESCRIBE.get(bad, f"{bad!r}")
        return (f"contains {what}: a flag is one token of the characters {SAFE_CHARS} (no whitespace, quotes or "
                "shell metacharacters; give each flag as its own list item)")
    host = _HOST_LIST.fullmatch(flag)
    if host:  # nvcc hands these to the host compiler: each item must be an allowed host flag itself
        for item in host.group(2).split(","):
            why = flag_problem(item)
            if why is not None:
                return f"its item {item!r} is refused: {why}"
        return None
    tool = _TOOL_LIST.fullmatch(flag)
    items = tool.group(2).split(",") if tool else [flag]
    if any(_DANGEROUS.match(item) for item in items) or flag.startswith(("-fplugin", "-fpass-plugin")):
        return "loads code into the compiler or linker, or reads options from a file"
    for rx, _ in _COMPILED:
        if rx.fullmatch(flag):
            return None
    return f"not an allowed flag shape (allowed: {SHAPES})"


def check_flags(flags: object, where: str, key: str) -> None:
    """Raise UserError (one line: where, key, the flag, why) unless every item of `flags` is allowed."""
    from evoengineer.errors import UserError

    for i, flag in enumerate(flags if isinstance(flags, (list, tuple)) else [flags]):
        why = flag_problem(flag)
        if why is not None:
            raise UserError(f"{where}: build.{key}[{i}]: flag {flag!r} refused: {why}")

