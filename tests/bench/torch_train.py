"""PyTorch baseline for bench_train: the same models, batch, optimiser and
data, timed the same way (one pass after a 20-step warm-up). Prints one JSON
line. Needs Debian's python3-torch; used only by scripts/bench.sh."""
import argparse
import gzip
import json
import time

import numpy as np
import torch
from torch import nn


def load(data, limit):
    def idx(path, offset):
        with gzip.open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)
    x = idx(f"{data}/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:limit]
    y = idx(f"{data}/train-labels-idx1-ubyte.gz", 8)[:limit]
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock with GroupNorm(8, C) in place of BatchNorm."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.GroupNorm(8, cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.GroupNorm(8, cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.GroupNorm(8, cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """Strata's built-in resnet (docs/architecture.md): ResNet-18's layout at
    widths 16, 32, 64, 128 for 1x28x28 inputs."""

    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.GroupNorm(8, widths[0])
        self.relu = nn.ReLU()
        cin = widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}",
                    nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def model(name):
    if name == "resnet":
        return ResNet()
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200),
                             nn.ReLU(), nn.Linear(200, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--images", type=int, default=0)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    n = a.images or (60000 if a.model == "mlp" else 4000)
    x, y = load(a.data, n)
    net = model(a.model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        xb, yb = x[i:i + a.batch], y[i:i + a.batch]
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()

    for s in range(20):
        step((s * a.batch) % n)
    perm = torch.randperm(n)
    x, y = x[perm], y[perm]
    t0 = time.perf_counter()
    for i in range(0, n, a.batch):
        step(i)
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": a.model,
                      "threads": a.threads, "batch": a.batch, "images": n, "seconds": dt,
                      "images_per_second": n / dt}))


if __name__ == "__main__":
    main()
