"""PyTorch's side of nn/optim/grad_scaler_torch_test.cc: torch.amp.GradScaler
("cpu") driving SGD with momentum on a linear model for 8 iterations, an inf
put into a gradient after backward at iterations 2 and 5 (a NaN at 6), every
odd iteration unscaling first and clipping the true gradients to norm 0.5.
init_scale 1024, growth_interval 2.

Usage: torch_grad_scaler.py SEED
Weights and data are float64 uniforms from SEED cast to float32, as the
Ember side draws them. Lines: "<name>: <float.hex values>" for each
iteration's scale after update() ("scale"), whether it stepped ("stepped"),
and at the end the weight and bias and the state_dict's _growth_tracker.
"""
import sys

import torch


def uniform(*shape):
    return torch.rand(*shape, dtype=torch.float64)


def main():
    torch.manual_seed(int(sys.argv[1]))
    w = ((uniform(3, 4) * 2 - 1) * 0.5).float().requires_grad_()
    b = ((uniform(3) * 2 - 1) * 0.1).float().requires_grad_()
    x = (uniform(8, 4) * 2 - 1).float()
    y = (uniform(8, 3) * 2 - 1).float()
    opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    scales, stepped = [], []
    for it in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(x @ w.t() + b, y)
        scaler.scale(loss).backward()
        if it in (2, 5):
            w.grad[1, 2] = float("inf")
        if it == 6:
            b.grad[0] = float("nan")
        if it % 2 == 1:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([w, b], 0.5)
        before = w.detach().clone()
        scaler.step(opt)
        stepped.append(0.0 if torch.equal(before, w.detach()) else 1.0)
        scaler.update()
        scales.append(scaler.get_scale())
    print("scale:", " ".join(float(v).hex() for v in scales))
    print("stepped:", " ".join(float(v).hex() for v in stepped))
    print("w:", " ".join(float(v).hex() for v in w.detach().double().flatten()))
    print("b:", " ".join(float(v).hex() for v in b.detach().double().flatten()))
    print("growth_tracker:", float(scaler.state_dict()["_growth_tracker"]).hex())


if __name__ == "__main__":
    main()
