#!/usr/bin/env python3
"""PyTorch CPU peer of downpour-bench-engine: images/s of a full fp32 training step.

A training step is forward, softmax cross-entropy, backward and an SGD update (momentum 0.9,
weight decay 5e-4), on random N(0,1) images and random labels, exactly what the engine's
TimeTrainingStepMs does. The nets are configs/models/*.toml layer for layer:
  alexnet:      Caffe's bvlc_alexnet (conv1 11x11/4, LRN(5, 1e-4, 0.75, k=1) via
                nn.LocalResponseNorm, overlapping 3/2 max pooling with Caffe's ceil rounding,
                grouped conv2/4/5, fc6/fc7 4096 + dropout 0.5, fc8 1000), 3x227x227 input.
  fmnist_small: conv(32,5x5)-relu-pool(3/2) -> conv(64,5x5,pad 2)-relu-pool(3/2) ->
                fc(256)-relu-dropout(0.3) -> fc(10), 1x28x28 input.
Prints one JSON object per model on stdout. Usage:
  /usr/bin/python3 bench/engine/pytorch_engine_peer.py --model alexnet --batch 64 --iterations 5 --threads 2
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn


def alexnet():
    return nn.Sequential(
        nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(),
        nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(),
        nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(256 * 6 * 6, 4096), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(4096, 1000),
    ), (3, 227, 227), 1000


def fmnist_small():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(64 * 6 * 6, 256), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(256, 10),
    ), (1, 28, 28), 10


MODELS = {"alexnet": alexnet, "fmnist_small": fmnist_small}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.batch < 1 or args.iterations < 1 or args.threads < 1:
        sys.exit(f"pytorch_engine_peer.py: --batch, --iterations and --threads must be >= 1 "
                 f"(got {args.batch}, {args.iterations}, {args.threads})")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    net, shape, classes = MODELS[args.model]()
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-5, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, *shape)
    y = torch.randint(0, classes, (args.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.iterations):
        step()
    ms = (time.perf_counter() - t0) * 1000.0 / args.iterations
    print(json.dumps({"what": "pytorch", "model": args.model, "batch": args.batch,
                      "threads": args.threads, "iterations": args.iterations,
                      "torch": torch.__version__, "step_ms": round(ms, 2),
                      "images_per_s": round(1000.0 * args.batch / ms, 2)}))


if __name__ == "__main__":
    main()
