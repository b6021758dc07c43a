"""Compares the delta chains a coordinator with --downlink serves against
one merged update per chain, in a finished strata-sim run.

A chain from version u to v is what GET /v1/models/{v}/delta?from=u
sends: the delta files u+1 .. v with 8 bytes of header and 4 a delta.
The merged alternative sends, once, the values of x̂ of version v at every
coordinate where it differs from x̂ of version u: exact (the client's digest
still matches) but with float32 values instead of the deltas' compressed
ones. Its size is estimated as two zstd frames (level 19, the zstd command):
the gaps between changed coordinates as LEB128 varints, and the float32
values. Prints one line per chain and a JSON summary line.

Usage: python3 tests/bench/chain_merge.py RUN_DIR [--length L] [--step S]
RUN_DIR is a strata-sim --out directory (or a study's runs/NAME) run with
--downlink; its state/checkpoints holds model-V.safetensors and delta-V.bin.
Needs only python3 and the zstd command."""
import argparse
import array
import json
import os
import struct
import subprocess
import sys


def read_values(path):
    """All tensors of a safetensors file, in file order, as one float array."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = array.array("f")
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name}: dtype {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out.frombytes(data[a:b])
    if sys.byteorder != "little":
        out.byteswap()
    return out


def zstd_len(blob):
    r = subprocess.run(["zstd", "-19", "-q", "-c"], input=blob, capture_output=True, check=True)
    return len(r.stdout)


def merged_len(old, new):
    gaps = bytearray()
    vals = array.array("f")
    prev = -1
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            g = i - prev - 1
            prev = i
            while g >= 0x80:
                gaps.append((g & 0x7F) | 0x80)
                g >>= 7
            gaps.append(g)
            vals.append(b)
    return len(vals), zstd_len(bytes(gaps)) + zstd_len(vals.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--length", type=int, default=7, help="deltas a chain (7)")
    ap.add_argument("--step", type=int, default=3, help="first versions this far apart (3)")
    a = ap.parse_args()
    if a.length < 1 or a.step < 1:
        sys.exit("--length and --step must be at least 1")
    ck = os.path.join(a.run_dir, "state", "checkpoints")
    if not os.path.isdir(ck):
        sys.exit(f"{ck}: no such directory (is {a.run_dir} a strata-sim --out directory?)")
    last = 0
    while os.path.exists(os.path.join(ck, f"model-{last + 1}.safetensors")):
        last += 1
    rows = []
    for u in range(1, last - a.length + 1, a.step):
        v = u + a.length
        deltas = [os.path.join(ck, f"delta-{w}.bin") for w in range(u + 1, v + 1)]
        if not all(os.path.exists(p) for p in deltas):
            continue
        chain = 8 + sum(4 + os.path.getsize(p) for p in deltas)
        old = read_values(os.path.join(ck, f"model-{u}.safetensors"))
        new = read_values(os.path.join(ck, f"model-{v}.safetensors"))
        changed, merged = merged_len(old, new)
        rows.append((chain, merged))
        print(f"{u}->{v}: chain {chain} bytes; merged {merged} bytes "
              f"({changed} of {len(new)} values changed, {changed / len(new):.2%}); "
              f"merged/chain {merged / chain:.2f}")
    if not rows:
        sys.exit(f"{ck}: no chain of {a.length} deltas with both models kept")
    c = sum(r[0] for r in rows) / len(rows)
    m = sum(r[1] for r in rows) / len(rows)
    print(json.dumps({"chains": len(rows), "length": a.length, "mean_chain_bytes": round(c),
                      "mean_merged_bytes": round(m), "merged_over_chain": round(m / c, 3)}))


if __name__ == "__main__":
    main()
