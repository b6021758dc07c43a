"""Loads a Strata checkpoint (safetensors) into the PyTorch definition of its
built-in model with load_state_dict(strict=True) and evaluates it on the test
split. Prints one JSON line: test accuracy and mean loss, to compare with
`strata-tool eval --json` on the same checkpoint. Needs Debian's
python3-torch; used only by scripts/bench.sh."""
import argparse
import gzip
import json
import struct

import numpy as np
import torch
from torch import nn

from torch_train import model


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        tensors[name] = torch.from_numpy(
            np.frombuffer(data[a:b], dtype="<f4").copy().reshape(t["shape"]))
    return tensors, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(1)
    state, meta = read_safetensors(a.checkpoint)
    net = model(a.model)
    net.load_state_dict(state, strict=True)
    net.eval()
    mean, std = (float(v) for v in meta["strata.input_normalization"].split(","))

    def idx(path, offset):
        with gzip.open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)
    x = idx(f"{a.data}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(idx(f"{a.data}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    x = (torch.from_numpy(x.astype(np.float32) / 255.0) - mean) / std
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), 500):
            z = net(x[i:i + 500])
            correct += int((z.argmax(1) == y[i:i + 500]).sum())
            loss += float(nn.functional.cross_entropy(z, y[i:i + 500], reduction="sum"))
    print(json.dumps({"impl": "pytorch", "model": a.model, "parameters": len(state),
                      "accuracy": correct / len(y), "loss": loss / len(y)}))


if __name__ == "__main__":
    main()
