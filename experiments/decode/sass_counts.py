"""Executed instructions per opcode of every kernel in an Nsight Compute report (issue 34: where a decode kernel's
instructions go), from `ncu --page source --csv --print-source sass` and, for labels and durations,
`ncu --page details` of the same report (profile.py's NVTX ranges name the kernels).

    python experiments/decode/sass_counts.py SOURCE.csv DETAILS.txt [--order PROFILE.log] [--keys 524288] [--top 14]

--order: profile.py's output (its "LABEL: ... us" lines, in launch order) names the kernels when the details page
has no NVTX ranges (an imported report): each main kernel takes the next label, a combine or reduction kernel the
label of the kernel before it.

--keys: (group, key) pairs of the profiled shape (B x Hkv x Sk; default the decode shape 8 x 8 x 8192), to report
instructions per key.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import re
import sys


def kernels_in_source(text: str) -> list[tuple[str, collections.Counter]]:
    out = []
    for part in re.split(r'^"Kernel Name",', text, flags=re.M)[1:]:
        lines = part.splitlines()
        rows = list(csv.reader(io.StringIO("\n".join(lines[1:]))))
        if not rows:
            continue
        head = rows[0]
        try:
            n_col, src_col = head.index("Instructions Executed"), head.index("Source")
        except ValueError:
            continue
        ops: collections.Counter = collections.Counter()
        for r in rows[1:]:
            if len(r) <= n_col or not r[src_col].strip():
                continue
            try:
                n = int(r[n_col].replace(",", ""))
            except ValueError:
                continue
            words = r[src_col].split()
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            ops[op.split(".")[0]] += n
        out.append((lines[0].strip().strip(",").strip('"'), ops))
    return out


def labels_in_details(text: str) -> list[tuple[str, str]]:
    """(label, duration) per kernel, in report order."""
    out, label = [], "?"
    for line in text.splitlines():
        m = re.match(r"^\s*<\d+,(.+)>\s*$", line)
        if m:
            label = m.group(1)
        m = re.match(r"^\s+Duration\s+(\S+)\s+([\d.,]+)", line)
        if m:
            out.append((label, f"{m.group(2)} {m.group(1)}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("details")
    ap.add_argument("--order", help="profile.py's log: labels in launch order")
    ap.add_argument("--keys", type=int, default=8 * 8 * 8192)
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args()
    kernels = kernels_in_source(open(a.source).read())
    labels = labels_in_details(open(a.details).read())
    if a.order:
        order = [m.group(1) for m in re.finditer(r"^(\S+): [\d.]+ us", open(a.order).read(), flags=re.M)]
        named, k = [], -1
        for name, _ in kernels:
            helper = "combine" in name or "reduction" in name
            k += 0 if helper and k >= 0 else 1
            named.append((order[k] if k < len(order) else "?") + (" (its combine)" if helper else ""))
        labels = [(lab, dur) for lab, (_, dur) in zip(named, labels)]
    for i, (name, ops) in enumerate(kernels):
        label, dur = labels[i] if i < len(labels) else ("?", "?")
        total = sum(ops.values())
        print(f"{label}: {name[:60]}  duration {dur}  instructions {total}  ({total / a.keys:.1f} per key)")
        print("   " + ", ".join(f"{op} {n / a.keys:.2f}" for op, n in ops.most_common(a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
