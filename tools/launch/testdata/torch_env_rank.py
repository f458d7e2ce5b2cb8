"""A PyTorch 2.x rank started by Ember's launch (launch_torch_test.cc): joins
by env://, all_reduces its rank + 1 over gloo and writes the sum to
OUT_DIR/rank<RANK>, with whether its store was a client of the launcher's."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "")
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as out:
    out.write(f"{int(t.item())} {agent}")
dist.destroy_process_group()
