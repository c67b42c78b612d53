import time, torch, sys
from torch.profiler import profile, ProfilerActivity
from specdec.models.loading import load_model
from specdec.packed import verify_model
from specdec.target import TargetModel
import specdec.attention
loaded = load_model(dtype="bf16"); model = verify_model(loaded)
model.set_attn_implementation(sys.argv[1])
target = TargetModel(model); V = model.config.vocab_size; g = torch.Generator().manual_seed(0)
tokens, parents = torch.arange(4), torch.tensor([-1, 0, 0, 0])
for ctx in (128, 1024):
    target.prefill(torch.randint(0, V, (ctx,), generator=g))
    for _ in range(3): target.forward_tree(tokens, parents); target.trim(ctx)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5): target.forward_tree(tokens, parents); target.trim(ctx)
    s = time.perf_counter()
    for _ in range(5): target.forward_tree(tokens, parents); target.trim(ctx)
    print("ctx", ctx, "wall ms", (time.perf_counter() - s) / 5 * 1e3)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
