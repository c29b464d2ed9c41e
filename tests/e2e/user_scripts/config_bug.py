"""A torchrun script with a deterministic bug: it reads a key its config does not have."""

import torch
import torch.distributed as dist


def load_config():
    return {"lr": 0.1, "epochs": 2}


def main():
    dist.init_process_group("gloo")
    cfg = load_config()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["learning_rate"])
    print(opt)


if __name__ == "__main__":
    main()
