# Test of the tests (issue 34): removes the first or the second cluster barrier of the cluster combine from the
# decode template in place (run on a scratch copy of the tree only), so that test_cluster_combine_is_sanitizer_clean
# and the correctness tests can be seen to fail.
#   python3 experiments/decode/probes/plant_cluster_bug.py first|second
import sys
from pathlib import Path
p = Path("templates/cuda/decode.cu.j2")
s = p.read_text()
block_start = s.index("    if (p.cluster) {\n        cluster_sync();")
i = s.index("        cluster_sync();\n", block_start)
j = s.index("        cluster_sync();\n", i + 10)
which = sys.argv[1]
cut = i if which == "first" else j
s = s[:cut] + s[cut + len("        cluster_sync();\n"):]
p.write_text(s)
print("removed", which)
