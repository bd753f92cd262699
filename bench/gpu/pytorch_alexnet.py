#!/usr/bin/env python3
"""PyTorch eager fp32 AlexNet training throughput, the peer of downpour-bench-gpu.

The net is configs/models/alexnet.toml layer for layer (Caffe's bvlc_alexnet: conv1 11x11/4,
LRN(5, 1e-4, 0.75, k=1), overlapping 3/2 max pooling with Caffe's ceil rounding, grouped conv2/4/5,
fc6/fc7 4096 with dropout 0.5, fc8 1000, softmax cross-entropy), SGD momentum 0.9, weight decay 5e-4.
cudnn.benchmark = True (the peer of downpour's conv algorithm search); TF32 for convolutions and
matmuls together, on or off (--tf32), as downpour's CudaOptions::tf32.

Reports per batch size: fwd+bwd ms, fwd+bwd+SGD ms, the same step with the batch uploaded every
step from page-locked host memory (upload_step: the peer of downpour-bench-gpu's worker_step, whose
input comes from the loader's page-locked ring), images/s, and per-layer forward ms (CUDA events
around each module). Usage:
  /usr/bin/python3 bench/gpu/pytorch_alexnet.py --batch 128 256 --iterations 20 --json out.json
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn


def alexnet():
    return nn.Sequential(
        nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(inplace=False),
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
    )


def timed(fn, iterations, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iterations):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / iterations


def per_layer_forward_ms(model, x, iterations):
    names, times = [], []
    for i, m in enumerate(model):
        names.append(f"{i}:{m.__class__.__name__}")
        times.append(0.0)
    for _ in range(iterations):
        h = x
        for i, m in enumerate(model):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            h = m(h)
            end.record()
            end.synchronize()
            times[i] += start.elapsed_time(end)
    return [{"name": n, "forward_ms": t / iterations} for n, t in zip(names, times)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--tf32", choices=["on", "off"], default="on")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"pytorch_alexnet.py: torch {torch.__version__} sees no CUDA device "
                 f"(torch.version.cuda = {torch.version.cuda}); a CUDA build of PyTorch and a GPU are needed")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    dev = torch.device("cuda", args.gpu)
    torch.manual_seed(1)
    out = {"framework": f"pytorch {torch.__version__} (cuda {torch.version.cuda}, cudnn "
                        f"{torch.backends.cudnn.version()})",
           "device": torch.cuda.get_device_name(dev), "tf32": args.tf32 == "on", "batches": []}
    print(out["framework"], "on", out["device"], "tf32", args.tf32)
    for batch in args.batch:
        model = alexnet().to(dev).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(batch, 3, 227, 227, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)

        def fwd_bwd():
            opt.zero_grad(set_to_none=False)
            loss_fn(model(x), y).backward()

        def step():
            fwd_bwd()
            opt.step()
        x_host = torch.randn(batch, 3, 227, 227).pin_memory()

        def upload_step():
            opt.zero_grad(set_to_none=False)
            loss_fn(model(x_host.to(dev, non_blocking=True)), y).backward()
            opt.step()

        fb = timed(fwd_bwd, args.iterations, args.warmup)
        st = timed(step, args.iterations, args.warmup)
        up = timed(upload_step, args.iterations, args.warmup)
        with torch.no_grad():
            layers = per_layer_forward_ms(model, x, max(3, args.iterations // 4))
        r = {"batch": batch, "fwd_bwd_ms": fb, "step_ms": st, "upload_step_ms": up,
             "fwd_bwd_images_per_s": 1000 * batch / fb, "step_images_per_s": 1000 * batch / st,
             "upload_step_images_per_s": 1000 * batch / up, "layers": layers}
        out["batches"].append(r)
        print(f"batch {batch}: fwd+bwd {fb:.3f} ms ({r['fwd_bwd_images_per_s']:.1f} img/s), "
              f"fwd+bwd+SGD {st:.3f} ms ({r['step_images_per_s']:.1f} img/s), "
              f"with the input uploaded {up:.3f} ms ({r['upload_step_images_per_s']:.1f} img/s)")
        for l in layers:
            print(f"  {l['name']:<24} forward {l['forward_ms']:.3f} ms")
        del model, opt, x, y, x_host
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
