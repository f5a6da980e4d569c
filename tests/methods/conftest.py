import torch

# Small nets on a shared CPU: one intra-op thread is the fastest (the trainers set --threads 1 too).
torch.set_num_threads(1)
