#!/usr/bin/env python3
"""Trains torchvision's ResNet-18 (10 classes) on synthetic CIFAR-shaped data (no downloads)
and reports each epoch to jouled with joule.progress, printing STEP's projection of the job's
energy once there is one. Outside jouled it trains all the same (progress does nothing).

    python3 examples/pytorch/train_cifar_resnet.py
    python3 -m joule submit examples/pytorch/train_cifar_resnet.py \
        --spec-from examples/pytorch/train_cifar_resnet.py:model --input 3,32,32 \
        --batch-size 64 --epochs 5 --samples-per-epoch 512

`model` is the factory the spec is traced from, so the estimate is of the network trained here.
The defaults take about half a minute on two CPU cores.
"""

import argparse
import time

import torch
import torch.nn as nn
import torchvision

import joule


def model():
    return torchvision.models.resnet18(num_classes=10)


def synthetic_cifar(samples, seed=0):
    """Noisy copies of one random template per class: learnable, and nothing to download."""
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    images = 0.5 * templates[labels] + torch.randn(samples, 3, 32, 32, generator=generator)
    return images, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples-per-epoch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args()

    torch.manual_seed(0)
    network = model()
    images, labels = synthetic_cifar(args.samples_per_epoch)
    optimizer = torch.optim.SGD(network.parameters(), lr=args.lr, momentum=0.9)
    loss_function = nn.CrossEntropyLoss()
    network.train()
    for epoch in range(1, args.epochs + 1):
        started, total, batches = time.monotonic(), 0.0, 0
        order = torch.randperm(args.samples_per_epoch)
        for first in range(0, args.samples_per_epoch, args.batch_size):
            batch = order[first:first + args.batch_size]
            optimizer.zero_grad()
            loss = loss_function(network(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        projection = joule.progress(epoch, of=args.epochs, loss=total / batches)
        line = f"epoch {epoch}/{args.epochs}: loss {total / batches:.3f}, {time.monotonic() - started:.1f} s"
        if projection is not None:
            joules = projection["joules"]
            line += (f"; STEP projects {joules['mean']:.0f} ± {joules['std']:.0f} J for the job "
                     f"({projection['method']}, {projection['source']}), {projection['seconds_remaining']:.0f} s left")
        print(line, flush=True)


if __name__ == "__main__":
    main()
