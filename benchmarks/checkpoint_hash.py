"""What a training checkpoint's checksums cost: every file hashed one after another against
`train`'s several at once (mixln_convert.training.trainer._sha256s), side by side in one run, on
files written here (page-cached, so this measures the hashing, not the disk).

    python benchmarks/checkpoint_hash.py [--files 4] [--mib 256] [--repeats 3]
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

from mixln_convert.data.shards import file_sha256
from mixln_convert.training.trainer import _sha256s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256, help="size of each file")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for i in range(args.files):
            files[f"shard-{i}"] = Path(tmp) / f"shard-{i}"
            files[f"shard-{i}"].write_bytes(os.urandom(args.mib << 20))
        one_by_one = {name: file_sha256(path) for name, path in files.items()}  # warms the page cache
        times = {"one after another": [], "several at once": []}
        for _ in range(args.repeats):
            for label, run in (("one after another", lambda: {n: file_sha256(p) for n, p in files.items()}),
                               ("several at once", lambda: _sha256s(files))):
                started = time.perf_counter()
                assert run() == one_by_one
                times[label].append(time.perf_counter() - started)
    total = args.files * args.mib / 1024
    print(f"{args.files} files of {args.mib} MiB ({total:.2f} GiB), {os.cpu_count()} cores, best of {args.repeats}:")
    best = {label: min(t) for label, t in times.items()}
    for label, seconds in best.items():
        print(f"  {label}: {seconds:.2f} s ({total / seconds:.2f} GiB/s)")
    print(f"  several at once / one after another: {best['several at once'] / best['one after another']:.2f}x the time")


if __name__ == "__main__":
    main()
